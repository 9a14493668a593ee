//! What the examples share: the server they run against, and how they end (an error as a
//! sentence on standard error, and a failing exit code).

// Each example uses the part it needs.
#![allow(dead_code)]

use std::error::Error;
use std::process::ExitCode;

use mongodb::Client;

/// The server to use: `MONGODB_URI`, or a local MongoDB.
pub fn mongodb_uri() -> String {
    std::env::var("MONGODB_URI").unwrap_or_else(|_| "mongodb://localhost:27017".to_owned())
}

/// Connects to the server, runs `example` with the client, then ends the driver's work while
/// the runtime still runs (so that no task of the driver or of the locks' background work ends
/// with the runtime mid-request), and reports how it went ([`exit`]).
pub async fn run(example: impl AsyncFnOnce(&Client) -> Result<(), Box<dyn Error>>) -> ExitCode {
    let client = match Client::with_uri_str(mongodb_uri()).await {
        Ok(client) => client,
        Err(error) => return exit(Err(error.into())),
    };
    let outcome = example(&client).await;
    client.shutdown().await;
    exit(outcome)
}

/// The exit code of an example that ended with `outcome`; an error is printed first, as a
/// sentence, with what caused it.
pub fn exit(outcome: Result<(), Box<dyn Error>>) -> ExitCode {
    let Err(error) = outcome else {
        return ExitCode::SUCCESS;
    };
    eprintln!("error: {error}");
    let mut cause = error.source();
    while let Some(source) = cause {
        eprintln!("  caused by: {source}");
        cause = source.source();
    }
    ExitCode::FAILURE
}

//! Flotilla's compute sharing, pure parts: exact credits and providers' prices
//! ([`credits`], [`price`]), availability windows ([`availability`]), the double-entry ledger ([`ledger`]), the verification of
//! untrusted results with providers' reputation ([`verify`]), and that policy in a simulated
//! pool ([`sim`]). No I/O, no async: the coordinator drives them from its state machine and
//! journals what they decide.

pub mod availability;
pub mod credits;
pub mod error;
pub mod ledger;
pub mod price;
pub mod sim;
pub mod verify;

pub use availability::Windows;
pub use credits::Credits;
pub use error::PoolError;
pub use ledger::{Account, Applied, Ledger, Op, Transaction};
pub use price::{Metered, Price};
pub use sim::{simulate_verification, VerifyReport, VerifySim};
pub use verify::{Accepted, Reputation, Verdict, Verifier, VerifyConfig, VerifyMode};

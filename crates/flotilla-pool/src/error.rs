//! What the pool's pure parts refuse.

use crate::credits::Credits;

/// An operation refused; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// An amount that does not read.
    #[error("{what}: {value:?} is not an amount of credits: {why}")]
    BadAmount {
        /// The field or option.
        what: String,
        /// What was given.
        value: String,
        /// Why.
        why: String,
    },
    /// A price list that does not read.
    #[error("price {value:?}: {why}")]
    BadPrice {
        /// What was given.
        value: String,
        /// Why.
        why: String,
    },
    /// Availability windows that do not read.
    #[error("availability {value:?}: {why}")]
    BadWindow {
        /// What was given.
        value: String,
        /// Why.
        why: String,
    },
    /// A tenant has fewer credits than an operation needs.
    #[error("tenant {tenant} has {balance} credits, {needed} are needed")]
    InsufficientCredits {
        /// The tenant.
        tenant: String,
        /// Its balance.
        balance: Credits,
        /// What the operation needs.
        needed: Credits,
    },
    /// A transaction whose postings do not sum to zero (a bug: never applied).
    #[error("transaction {key} does not balance (its postings sum to {sum})")]
    Unbalanced {
        /// Its key.
        key: String,
        /// The sum.
        sum: Credits,
    },
    /// Anything else refused, with why.
    #[error("{0}")]
    Refused(String),
}

//! The double-entry ledger of credits.
//!
//! Every transaction is a set of postings that sum to zero, so credits are never made or
//! lost by a transaction; only a grant (an admin handing a tenant credits) brings credits in,
//! from the `Issuer` account, whose balance is minus everything handed out. Hence the
//! invariant, kept after every operation and checked by a property test over random
//! sequences: the balances of all other accounts sum to the credits handed out.
//!
//! A consumer's credits for a task are first *held* (moved to its escrow account) when the
//! task is placed; once the result is accepted the hold is *settled*: the metered cost goes
//! from escrow to the provider, less the platform's fee, and the rest back to the consumer;
//! a rejected result, a cancelled or preempted attempt *releases* the hold whole. So a
//! provider is paid only for accepted results, a consumer pays nothing for rejected ones, and
//! a hold that cannot be made (too few credits) is refused before anything runs.
//!
//! Every operation carries a key (the attempt it is for); applying a key twice is a no-op
//! that says so ([`Applied::Duplicate`]): a retried report, a duplicate result after a
//! partition, a replayed journal never charge twice.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::credits::Credits;
use crate::error::PoolError;

/// An account of the ledger.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Account {
    /// Where granted credits come from; its balance is minus all credits handed out.
    Issuer,
    /// A consumer's spendable credits.
    Tenant(String),
    /// A consumer's credits held for attempts placed and not yet settled.
    Escrow(String),
    /// A provider's earnings.
    Provider(String),
    /// The platform's fees.
    Platform,
}

impl Account {
    /// Its kind, as `flotilla ledger --json` names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Account::Issuer => "issuer",
            Account::Tenant(_) => "tenant",
            Account::Escrow(_) => "escrow",
            Account::Provider(_) => "provider",
            Account::Platform => "platform",
        }
    }

    /// Its name (the tenant's or provider's; the kind for the others).
    pub fn name(&self) -> &str {
        match self {
            Account::Tenant(n) | Account::Escrow(n) | Account::Provider(n) => n,
            Account::Issuer => "issuer",
            Account::Platform => "platform",
        }
    }
}

/// What an operation is, for statements and the journal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Credits handed to a tenant.
    Grant {
        /// The tenant.
        tenant: String,
        /// How much.
        amount: Credits,
    },
    /// Credits of a tenant held for an attempt.
    Hold {
        /// The tenant.
        tenant: String,
        /// How much.
        amount: Credits,
    },
    /// A hold paid out: `cost` of it to the provider (less the fee), the rest back.
    Settle {
        /// The key of the hold.
        hold: String,
        /// The provider paid.
        provider: String,
        /// What the accepted work cost (beyond the hold, at most what the tenant has left).
        cost: Credits,
        /// The platform's fee, parts per million of `cost`.
        fee_ppm: u32,
    },
    /// A hold given back whole.
    Release {
        /// The key of the hold.
        hold: String,
    },
}

/// A transaction: postings that sum to zero.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transaction {
    /// Its key (unique: a second one with the same key is a duplicate).
    pub key: String,
    /// What it was.
    pub op: Op,
    /// Amounts moved into (positive) or out of (negative) each account.
    pub postings: Vec<(Account, Credits)>,
}

/// Whether an operation changed the ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// It did, with this transaction.
    Done(Transaction),
    /// Its key was applied before: nothing changed.
    Duplicate,
}

/// An open hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct OpenHold {
    tenant: String,
    amount: Credits,
}

/// The ledger: balances, open holds, and every transaction in order.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    balances: BTreeMap<Account, Credits>,
    holds: HashMap<String, OpenHold>,
    keys: HashSet<String>,
    log: Vec<Transaction>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// The balance of `account` (zero if it never moved).
    pub fn balance(&self, account: &Account) -> Credits {
        self.balances.get(account).copied().unwrap_or_default()
    }

    /// Every account that ever moved, with its balance.
    pub fn balances(&self) -> impl Iterator<Item = (&Account, Credits)> {
        self.balances.iter().map(|(a, b)| (a, *b))
    }

    /// Credits handed out (minus the issuer's balance).
    pub fn issued(&self) -> Credits {
        -self.balance(&Account::Issuer)
    }

    /// The sum of every account but the issuer's: always [`Ledger::issued`].
    pub fn total(&self) -> Credits {
        self.balances
            .iter()
            .filter(|(a, _)| **a != Account::Issuer)
            .map(|(_, b)| *b)
            .sum()
    }

    /// Every transaction, in order.
    pub fn transactions(&self) -> &[Transaction] {
        &self.log
    }

    /// The transactions that moved `account`.
    pub fn statement<'a>(&'a self, account: &'a Account) -> impl Iterator<Item = &'a Transaction> {
        self.log
            .iter()
            .filter(move |t| t.postings.iter().any(|(a, _)| a == account))
    }

    /// Whether the hold `key` is open.
    pub fn is_held(&self, key: &str) -> bool {
        self.holds.contains_key(key)
    }

    /// Gives `tenant` `amount` credits (from the issuer).
    pub fn grant(
        &mut self,
        key: &str,
        tenant: &str,
        amount: Credits,
    ) -> Result<Applied, PoolError> {
        if amount.is_negative() {
            return Err(PoolError::Refused(format!(
                "a grant of {amount} credits to {tenant} is negative"
            )));
        }
        let op = Op::Grant {
            tenant: tenant.to_string(),
            amount,
        };
        self.post(
            key,
            op,
            vec![
                (Account::Issuer, -amount),
                (Account::Tenant(tenant.to_string()), amount),
            ],
        )
    }

    /// Holds `amount` of `tenant`'s credits under `key` (an attempt placed); refused when
    /// its balance is smaller.
    pub fn hold(&mut self, key: &str, tenant: &str, amount: Credits) -> Result<Applied, PoolError> {
        if self.keys.contains(key) {
            return Ok(Applied::Duplicate);
        }
        if amount.is_negative() {
            return Err(PoolError::Refused(format!(
                "a hold of {amount} is negative"
            )));
        }
        let have = self.balance(&Account::Tenant(tenant.to_string()));
        if have < amount {
            return Err(PoolError::InsufficientCredits {
                tenant: tenant.to_string(),
                balance: have,
                needed: amount,
            });
        }
        let applied = self.post(
            key,
            Op::Hold {
                tenant: tenant.to_string(),
                amount,
            },
            vec![
                (Account::Tenant(tenant.to_string()), -amount),
                (Account::Escrow(tenant.to_string()), amount),
            ],
        )?;
        self.holds.insert(
            key.to_string(),
            OpenHold {
                tenant: tenant.to_string(),
                amount,
            },
        );
        Ok(applied)
    }

    /// Settles the hold `hold` under `key`: `cost` to `provider` less
    /// `fee_ppm` parts per million to the platform, the rest back to the tenant.
    pub fn settle(
        &mut self,
        key: &str,
        hold: &str,
        provider: &str,
        cost: Credits,
        fee_ppm: u32,
    ) -> Result<Applied, PoolError> {
        if self.keys.contains(key) {
            return Ok(Applied::Duplicate);
        }
        let h = self.open_hold(hold, "settle")?;
        // Beyond the hold (the attempt ran longer than estimated), the rest of the tenant's
        // balance pays, never more: no balance goes negative.
        let have = self.balance(&Account::Tenant(h.tenant.clone()));
        let cost = cost.max(Credits::ZERO).min(h.amount + have);
        let fee = cost.ppm(fee_ppm.min(1_000_000));
        let applied = self.post(
            key,
            Op::Settle {
                hold: hold.to_string(),
                provider: provider.to_string(),
                cost,
                fee_ppm,
            },
            vec![
                (Account::Escrow(h.tenant.clone()), -h.amount),
                (Account::Provider(provider.to_string()), cost - fee),
                (Account::Platform, fee),
                (Account::Tenant(h.tenant.clone()), h.amount - cost),
            ],
        )?;
        self.holds.remove(hold);
        Ok(applied)
    }

    /// The open hold `hold`, or why there is none to `what`.
    fn open_hold(&self, hold: &str, what: &str) -> Result<OpenHold, PoolError> {
        self.holds
            .get(hold)
            .cloned()
            .ok_or_else(|| PoolError::Refused(format!("no open hold {hold:?} to {what}")))
    }

    /// Gives the hold `hold` back to its tenant whole, under `key`.
    pub fn release(&mut self, key: &str, hold: &str) -> Result<Applied, PoolError> {
        if self.keys.contains(key) {
            return Ok(Applied::Duplicate);
        }
        let h = self.open_hold(hold, "release")?;
        let applied = self.post(
            key,
            Op::Release {
                hold: hold.to_string(),
            },
            vec![
                (Account::Escrow(h.tenant.clone()), -h.amount),
                (Account::Tenant(h.tenant.clone()), h.amount),
            ],
        )?;
        self.holds.remove(hold);
        Ok(applied)
    }

    /// Applies a transaction read back (a journal replay): the same checks and effects as
    /// the operation that made it.
    pub fn replay(&mut self, t: &Transaction) -> Result<Applied, PoolError> {
        match &t.op {
            Op::Grant { tenant, amount } => self.grant(&t.key, tenant, *amount),
            Op::Hold { tenant, amount } => self.hold(&t.key, tenant, *amount),
            Op::Settle {
                hold,
                provider,
                cost,
                fee_ppm,
            } => self.settle(&t.key, hold, provider, *cost, *fee_ppm),
            Op::Release { hold } => self.release(&t.key, hold),
        }
    }

    fn post(
        &mut self,
        key: &str,
        op: Op,
        postings: Vec<(Account, Credits)>,
    ) -> Result<Applied, PoolError> {
        if self.keys.contains(key) {
            return Ok(Applied::Duplicate);
        }
        let sum: Credits = postings.iter().map(|(_, c)| *c).sum();
        if sum != Credits::ZERO {
            return Err(PoolError::Unbalanced {
                key: key.to_string(),
                sum,
            });
        }
        // Every balance stays exact: a posting that would pass the largest amount an account
        // can hold is refused whole (balances saturated, and the total stopped matching the
        // accounts' sum).
        let mut after = Vec::with_capacity(postings.len());
        for (a, c) in &postings {
            let now = self.balances.get(a).copied().unwrap_or_default();
            match now.0.checked_add(c.0) {
                Some(v) => after.push((a.clone(), Credits(v))),
                None => {
                    let what = match a {
                        // Minus everything handed out: it is the first to overflow.
                        Account::Issuer => "the credits handed out in all".to_string(),
                        a => format!("the balance of {} {}", a.kind(), a.name()),
                    };
                    return Err(PoolError::Refused(format!(
                        "{key}: {what} would pass the largest amount the ledger holds ({} \
                         credits)",
                        Credits(i64::MAX)
                    )));
                }
            }
        }
        for (a, v) in after {
            self.balances.insert(a, v);
        }
        self.keys.insert(key.to_string());
        let t = Transaction {
            key: key.to_string(),
            op,
            postings,
        };
        self.log.push(t.clone());
        Ok(Applied::Done(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c(n: i64) -> Credits {
        Credits::whole(n)
    }

    #[test]
    fn a_grant_that_would_overflow_an_account_is_refused_and_changes_nothing() {
        let mut l = Ledger::default();
        l.grant("g1", "a", Credits(i64::MAX - 20)).unwrap();
        l.grant("g2", "b", Credits(7)).unwrap();
        // Any tenant's grant past what can ever be handed out (the issuer's balance is
        // minus all of it, so it overflows before any tenant's could).
        for (key, who) in [("g3", "a"), ("g4", "c")] {
            let e = l.grant(key, who, Credits(15)).unwrap_err();
            assert!(
                e.to_string().contains(
                    "the credits handed out in all would pass the largest amount the ledger holds"
                ),
                "{e}"
            );
        }
        assert_eq!(
            l.balance(&Account::Tenant("a".into())),
            Credits(i64::MAX - 20)
        );
        assert_eq!(l.balance(&Account::Tenant("c".into())), Credits::ZERO);
        assert_eq!(l.total(), Credits(i64::MAX - 13));
        // A refused key is not taken: it may be used for a grant that fits.
        assert!(matches!(
            l.grant("g3", "a", Credits(13)),
            Ok(Applied::Done(_))
        ));
    }

    #[test]
    fn a_settled_hold_pays_the_provider_and_the_fee_and_returns_the_rest() {
        let mut l = Ledger::new();
        l.grant("g1", "alice", c(100)).unwrap();
        l.hold("h1", "alice", c(10)).unwrap();
        assert_eq!(l.balance(&Account::Tenant("alice".into())), c(90));
        assert_eq!(l.balance(&Account::Escrow("alice".into())), c(10));
        l.settle("s1", "h1", "bob", c(4), 50_000).unwrap();
        assert_eq!(l.balance(&Account::Tenant("alice".into())), c(96));
        assert_eq!(l.balance(&Account::Escrow("alice".into())), c(0));
        assert_eq!(
            l.balance(&Account::Provider("bob".into())),
            Credits::micro(3_800_000)
        );
        assert_eq!(l.balance(&Account::Platform), Credits::micro(200_000));
        assert_eq!(l.total(), c(100));
        assert_eq!(l.issued(), c(100));
        assert_eq!(l.statement(&Account::Provider("bob".into())).count(), 1);
    }

    #[test]
    fn work_beyond_its_hold_is_paid_from_the_balance_left_never_below_zero() {
        let mut l = Ledger::new();
        l.grant("g1", "alice", c(10)).unwrap();
        l.hold("h1", "alice", c(2)).unwrap();
        l.settle("s1", "h1", "bob", c(5), 0).unwrap();
        assert_eq!(l.balance(&Account::Tenant("alice".into())), c(5));
        assert_eq!(l.balance(&Account::Provider("bob".into())), c(5));
        l.hold("h2", "alice", c(1)).unwrap();
        l.settle("s2", "h2", "bob", c(100), 0).unwrap();
        assert_eq!(l.balance(&Account::Tenant("alice".into())), c(0));
        assert_eq!(l.balance(&Account::Provider("bob".into())), c(10));
        assert_eq!(l.total(), c(10));
    }

    #[test]
    fn duplicates_change_nothing_and_rejected_work_costs_nothing() {
        let mut l = Ledger::new();
        l.grant("g1", "alice", c(5)).unwrap();
        assert_eq!(l.grant("g1", "alice", c(5)).unwrap(), Applied::Duplicate);
        l.hold("h1", "alice", c(5)).unwrap();
        assert_eq!(l.hold("h1", "alice", c(5)).unwrap(), Applied::Duplicate);
        l.release("r1", "h1").unwrap();
        assert_eq!(l.release("r1", "h1").unwrap(), Applied::Duplicate);
        assert!(
            l.settle("s1", "h1", "bob", c(1), 0).is_err(),
            "a released hold is gone"
        );
        assert_eq!(l.balance(&Account::Tenant("alice".into())), c(5));
        assert_eq!(l.balance(&Account::Provider("bob".into())), c(0));
    }

    #[test]
    fn a_hold_beyond_the_balance_is_refused_naming_it() {
        let mut l = Ledger::new();
        l.grant("g1", "alice", c(1)).unwrap();
        let e = l.hold("h1", "alice", c(2)).unwrap_err().to_string();
        assert!(
            e.contains("alice") && e.contains("1") && e.contains("2"),
            "{e}"
        );
        assert!(!l.is_held("h1"));
    }

    #[test]
    fn a_replayed_log_gives_the_same_ledger() {
        let mut l = Ledger::new();
        l.grant("g", "a", c(50)).unwrap();
        l.hold("h", "a", c(20)).unwrap();
        l.settle("s", "h", "p", c(7), 100_000).unwrap();
        let mut r = Ledger::new();
        for t in l.transactions() {
            r.replay(t).unwrap();
        }
        assert_eq!(
            r.balances().collect::<Vec<_>>(),
            l.balances().collect::<Vec<_>>()
        );
        // Replaying again is all duplicates.
        for t in l.transactions() {
            assert_eq!(r.replay(t).unwrap(), Applied::Duplicate);
        }
    }

    #[derive(Clone, Debug)]
    enum Step {
        Grant(u8, i64),
        Hold(u8, u16, i64),
        Settle(u16, u8, i64, u32),
        Release(u16),
        /// Apply an earlier step's key again.
        Again(u16),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u8..3, 0i64..1_000_000_000).prop_map(|(t, a)| Step::Grant(t, a)),
            (0u8..3, 0u16..40, 0i64..500_000_000).prop_map(|(t, h, a)| Step::Hold(t, h, a)),
            (0u16..40, 0u8..3, -10i64..600_000_000, 0u32..200_000)
                .prop_map(|(h, p, c, f)| Step::Settle(h, p, c, f)),
            (0u16..40).prop_map(Step::Release),
            (0u16..200).prop_map(Step::Again),
        ]
    }

    proptest! {
        /// Whatever happens, in whatever order, repeated or not: every transaction sums to
        /// zero, the total equals the credits handed out, no tenant goes negative, and a
        /// replay of the log gives the same balances.
        #[test]
        fn the_total_is_the_credits_handed_out_forever(steps in proptest::collection::vec(step(), 1..120)) {
            let mut l = Ledger::new();
            let mut done: Vec<Transaction> = Vec::new();
            for (i, s) in steps.iter().enumerate() {
                let r = match s {
                    Step::Grant(t, a) => l.grant(&format!("g{i}"), &format!("t{t}"), Credits::micro(*a)),
                    Step::Hold(t, h, a) => l.hold(&format!("h{h}"), &format!("t{t}"), Credits::micro(*a)),
                    Step::Settle(h, p, c, f) => l.settle(&format!("s{h}"), &format!("h{h}"), &format!("p{p}"), Credits::micro(*c), *f),
                    Step::Release(h) => l.release(&format!("r{h}"), &format!("h{h}")),
                    Step::Again(k) => match done.get(*k as usize).cloned() {
                        Some(t) => {
                            prop_assert_eq!(l.replay(&t).unwrap(), Applied::Duplicate);
                            continue;
                        }
                        None => continue,
                    },
                };
                if let Ok(Applied::Done(t)) = r {
                    let sum: Credits = t.postings.iter().map(|(_, c)| *c).sum();
                    prop_assert_eq!(sum, Credits::ZERO);
                    done.push(t);
                }
                prop_assert_eq!(l.total(), l.issued());
                for (a, b) in l.balances() {
                    if a.kind() != "issuer" {
                        prop_assert!(!b.is_negative(), "{:?} went negative: {}", a, b);
                    }
                }
            }
            let mut r = Ledger::new();
            for t in l.transactions() {
                r.replay(t).unwrap();
            }
            prop_assert_eq!(r.balances().collect::<Vec<_>>(), l.balances().collect::<Vec<_>>());
        }
    }
}

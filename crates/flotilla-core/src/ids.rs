//! Identifiers: every id is a newtype made by [`define_id!`](crate::define_id), never a bare integer.

/// Defines a `Copy` newtype id over an unsigned integer, with `new`, `index`,
/// `Display` (`prefix` followed by the number) and serde support.
///
/// ```
/// flotilla_core::define_id!(
///     /// A frame of a film.
///     FrameId, u32, "f"
/// );
/// let f = FrameId::new(3);
/// assert_eq!(f.index(), 3);
/// assert_eq!(f.to_string(), "f3");
/// ```
#[macro_export]
macro_rules! define_id {
    ($(#[$meta:meta])* $name:ident, $int:ty, $prefix:literal) => {
        $(#[$meta])*
        #[derive(
            Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default,
            ::serde::Serialize, ::serde::Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub $int);

        impl $name {
            /// Makes the id from its number.
            pub const fn new(n: $int) -> Self {
                Self(n)
            }
            /// The number as a `usize`, for indexing dense tables.
            pub const fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl ::core::fmt::Display for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl From<$int> for $name {
            fn from(n: $int) -> Self {
                Self(n)
            }
        }
    };
}

define_id!(
    /// A job submitted to Flotilla.
    JobId, u64, "job-"
);
define_id!(
    /// One task instance in a job's graph (an array element is its own instance).
    TaskId, u32, "t"
);
define_id!(
    /// A worker process in a cluster.
    WorkerId, u32, "w"
);
define_id!(
    /// A piece of data registered with the in-process runtime.
    DataId, u32, "d"
);
define_id!(
    /// A processing unit: a CPU core, a GPU, an OpenCL device, a remote worker slot.
    UnitId, u32, "u"
);
define_id!(
    /// A memory node: host memory, one GPU's memory, one OpenCL device's memory.
    MemNodeId, u32, "m"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_display_with_prefix_and_order_by_number() {
        assert_eq!(TaskId::new(7).to_string(), "t7");
        assert_eq!(MemNodeId::new(0).to_string(), "m0");
        assert!(UnitId::new(1) < UnitId::new(2));
        assert_eq!(DataId::from(5).index(), 5);
    }
}

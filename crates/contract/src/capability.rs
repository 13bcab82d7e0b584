//! The six provider capability keys and the tri-state declaration.

use std::fmt;

/// A provider capability key of the contract. The set is closed: the validator
/// rejects any other key (the removed concurrency keys included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProviderCapability {
    ReusableLeases,
    NativeSyncIn,
    NativeSyncOut,
    PersistentProcessSessions,
    IndependentControlCommands,
    IncrementalSessionOutput,
}

impl ProviderCapability {
    /// All keys, in the order the spec lists them (and JSON output uses).
    pub const ALL: [ProviderCapability; 6] = [
        Self::ReusableLeases,
        Self::NativeSyncIn,
        Self::NativeSyncOut,
        Self::PersistentProcessSessions,
        Self::IndependentControlCommands,
        Self::IncrementalSessionOutput,
    ];

    /// The camelCase key used in manifests and JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReusableLeases => "reusableLeases",
            Self::NativeSyncIn => "nativeSyncIn",
            Self::NativeSyncOut => "nativeSyncOut",
            Self::PersistentProcessSessions => "persistentProcessSessions",
            Self::IndependentControlCommands => "independentControlCommands",
            Self::IncrementalSessionOutput => "incrementalSessionOutput",
        }
    }

    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == key)
    }

    /// Opt-in keys: an omitted declaration never grants them.
    pub fn is_opt_in(self) -> bool {
        matches!(self, Self::ReusableLeases | Self::IncrementalSessionOutput)
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for ProviderCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One declared key's state. Kept tri-valued all the way through: omitted is
/// not false, and true is not a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Declared {
    #[default]
    Omitted,
    False,
    True,
}

impl Declared {
    pub fn from_bool(b: bool) -> Self {
        if b {
            Self::True
        } else {
            Self::False
        }
    }

    /// `None` for omitted, for JSON output (`null`).
    pub fn as_option(self) -> Option<bool> {
        match self {
            Self::Omitted => None,
            Self::False => Some(false),
            Self::True => Some(true),
        }
    }
}

/// A value per capability key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CapabilityMap<T>([T; 6]);

impl<T> CapabilityMap<T> {
    pub fn from_fn(mut f: impl FnMut(ProviderCapability) -> T) -> Self {
        Self(ProviderCapability::ALL.map(&mut f))
    }

    pub fn get(&self, cap: ProviderCapability) -> &T {
        &self.0[cap.index()]
    }

    pub fn set(&mut self, cap: ProviderCapability, value: T) {
        self.0[cap.index()] = value;
    }

    pub fn iter(&self) -> impl Iterator<Item = (ProviderCapability, &T)> {
        ProviderCapability::ALL.into_iter().zip(self.0.iter())
    }
}

impl<T: Copy> CapabilityMap<T> {
    pub fn value(&self, cap: ProviderCapability) -> T {
        self.0[cap.index()]
    }
}

/// The `sandboxCapabilities` declaration after legacy folding: one tri-state per key.
pub type DeclaredCapabilities = CapabilityMap<Declared>;

/// An effective capability set: one boolean per key.
pub type EffectiveCapabilities = CapabilityMap<bool>;

//! Command capabilities: the vocabulary a template declares, the small set type
//! that holds a declaration, the one default baseline, and which worker methods
//! a provider needs to serve each capability.
//!
//! Adding a member to the vocabulary is one line in the `vocabulary!` table below
//! (variant, token, provider methods); everything else follows from it.

use std::fmt;

/// The worker method that serves one-shot command execution.
const EXECUTE: &[&str] = &["environmentExecute"];
/// The duplex byte-channel family (worker-protocol.md), the carrier for an
/// interactive terminal and for a forwarded port.
const DUPLEX: &[&str] = &[
    "duplexChannelOpen",
    "duplexChannelWrite",
    "duplexChannelClose",
];

macro_rules! vocabulary {
    ($( $(#[$doc:meta])* $variant:ident = $token:literal => $methods:expr, )+) => {
        /// A standard command capability: what a sandbox offers its caller.
        ///
        /// Declared by the template (`capabilities:` in `template.yaml`), never
        /// assumed. The vocabulary is extensible, hence `#[non_exhaustive]`.
        #[non_exhaustive]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum CommandCapability {
            $( $(#[$doc])* $variant, )+
        }

        impl CommandCapability {
            /// The whole vocabulary, in its canonical order (the order of
            /// [`CommandSet::iter`] and of every listing).
            pub const ALL: &'static [CommandCapability] = &[$( Self::$variant, )+];

            /// The token used in `template.yaml` and in JSON output.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( Self::$variant => $token, )+
                }
            }

            const fn methods(self) -> &'static [&'static str] {
                match self {
                    $( Self::$variant => $methods, )+
                }
            }
        }
    };
}

vocabulary! {
    /// Run commands in the sandbox (`run`, `exec`).
    Shell = "shell" => EXECUTE,
    /// Move files and directories in and out of the sandbox (`cp`).
    Files = "files" => EXECUTE,
    /// Run code snippets through an interpreter in the sandbox.
    Code = "code" => EXECUTE,
    /// An interactive terminal (PTY). Not in the baseline: declare it.
    Terminal = "terminal" => DUPLEX,
    /// Reach a TCP port inside the sandbox. Not in the baseline: declare it.
    Ports = "ports" => DUPLEX,
}

// A CommandSet is a bit set in a u32.
const _: () = assert!(CommandCapability::ALL.len() <= 32);

impl CommandCapability {
    /// The capability for a `template.yaml` token. Tokens are exact and
    /// lowercase: `Shell` is not `shell`.
    pub fn parse(token: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| c.as_str() == token)
    }

    /// The vocabulary as one comma-separated line, for messages.
    pub fn vocabulary_list() -> String {
        join(Self::ALL.iter().map(|c| c.as_str()))
    }

    /// Whether the capability belongs to [`DEFAULT_CAPABILITIES`].
    pub const fn is_baseline(self) -> bool {
        DEFAULT_CAPABILITIES.contains(self)
    }

    const fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

impl fmt::Display for CommandCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of command capabilities, iterated in vocabulary order.
///
/// `const`-constructible, so the baseline is one constant:
/// `CommandSet::of(&[CommandCapability::Shell, ...])`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CommandSet(u32);

/// The system default baseline: what a template that omits `capabilities:`
/// inherits, and what a sandbox offers when its template metadata is
/// unavailable. `terminal` and `ports` are not in it: they must be declared.
pub const DEFAULT_CAPABILITIES: CommandSet = CommandSet::of(&[
    CommandCapability::Shell,
    CommandCapability::Files,
    CommandCapability::Code,
]);

impl CommandSet {
    /// The empty set.
    pub const EMPTY: CommandSet = CommandSet(0);

    /// The empty set.
    pub const fn new() -> Self {
        Self::EMPTY
    }

    /// The set of the given capabilities (duplicates collapse).
    pub const fn of(caps: &[CommandCapability]) -> Self {
        let mut bits = 0;
        let mut i = 0;
        while i < caps.len() {
            bits |= caps[i].bit();
            i += 1;
        }
        Self(bits)
    }

    /// The whole vocabulary.
    pub const fn all() -> Self {
        Self::of(CommandCapability::ALL)
    }

    /// This set plus `cap`.
    #[must_use]
    pub const fn with(self, cap: CommandCapability) -> Self {
        Self(self.0 | cap.bit())
    }

    /// This set without `cap`.
    #[must_use]
    pub const fn without(self, cap: CommandCapability) -> Self {
        Self(self.0 & !cap.bit())
    }

    pub const fn contains(&self, cap: CommandCapability) -> bool {
        self.0 & cap.bit() != 0
    }

    /// Adds `cap`; returns whether it was new.
    pub fn insert(&mut self, cap: CommandCapability) -> bool {
        let new = !self.contains(cap);
        self.0 |= cap.bit();
        new
    }

    /// Removes `cap`; returns whether it was present.
    pub fn remove(&mut self, cap: CommandCapability) -> bool {
        let present = self.contains(cap);
        self.0 &= !cap.bit();
        present
    }

    pub const fn is_empty(&self) -> bool {
        self.0 == 0
    }

    pub const fn len(&self) -> usize {
        self.0.count_ones() as usize
    }

    #[must_use]
    pub const fn union(self, other: CommandSet) -> Self {
        Self(self.0 | other.0)
    }

    #[must_use]
    pub const fn intersection(self, other: CommandSet) -> Self {
        Self(self.0 & other.0)
    }

    /// The members of `self` that are not in `other`.
    #[must_use]
    pub const fn difference(self, other: CommandSet) -> Self {
        Self(self.0 & !other.0)
    }

    pub const fn is_subset(&self, other: &CommandSet) -> bool {
        self.0 & !other.0 == 0
    }

    /// The members, in vocabulary order.
    pub fn iter(&self) -> impl Iterator<Item = CommandCapability> + '_ {
        CommandCapability::ALL
            .iter()
            .copied()
            .filter(|c| self.contains(*c))
    }

    /// The members' tokens, in vocabulary order (for JSON output).
    pub fn tokens(&self) -> Vec<&'static str> {
        self.iter().map(CommandCapability::as_str).collect()
    }

    /// The set as a YAML flow sequence, as it would be written in
    /// `template.yaml`: `[shell, files, code]`.
    pub fn to_yaml_flow(&self) -> String {
        format!("[{}]", join(self.iter().map(CommandCapability::as_str)))
    }

    /// The set named by `tokens`, or the first token outside the vocabulary.
    pub fn from_tokens<'a>(tokens: impl IntoIterator<Item = &'a str>) -> Result<Self, &'a str> {
        let mut set = Self::EMPTY;
        for token in tokens {
            set.insert(CommandCapability::parse(token).ok_or(token)?);
        }
        Ok(set)
    }
}

impl FromIterator<CommandCapability> for CommandSet {
    fn from_iter<I: IntoIterator<Item = CommandCapability>>(iter: I) -> Self {
        let mut set = Self::EMPTY;
        for cap in iter {
            set.insert(cap);
        }
        set
    }
}

impl Extend<CommandCapability> for CommandSet {
    fn extend<I: IntoIterator<Item = CommandCapability>>(&mut self, iter: I) {
        for cap in iter {
            self.insert(cap);
        }
    }
}

impl fmt::Debug for CommandSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.iter().map(CommandCapability::as_str))
            .finish()
    }
}

/// `{shell, files, code}`; the empty set is `{}`.
impl fmt::Display for CommandSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{{{}}}",
            join(self.iter().map(CommandCapability::as_str))
        )
    }
}

fn join<'a>(items: impl Iterator<Item = &'a str>) -> String {
    items.collect::<Vec<_>>().join(", ")
}

/// The worker methods a provider must implement to serve `cap`:
/// `shell`, `files` and `code` travel over `environmentExecute` (files through
/// the base64-over-exec fallback when native sync is not effective);
/// `terminal` and `ports` need the duplex channel family.
pub fn provider_methods_for(cap: CommandCapability) -> &'static [&'static str] {
    cap.methods()
}

/// Every (capability, method) pair of `set` whose method the provider does not
/// support, in vocabulary order then method order. Empty when the provider can
/// serve the whole set. The runtime refuses to create a sandbox from a template
/// when this is not empty, naming the missing method.
pub fn missing_provider_methods(
    set: &CommandSet,
    supported: &impl Fn(&str) -> bool,
) -> Vec<(CommandCapability, &'static str)> {
    set.iter()
        .flat_map(|cap| provider_methods_for(cap).iter().map(move |m| (cap, *m)))
        .filter(|(_, method)| !supported(method))
        .collect()
}

/// The members of `set` the provider can serve completely.
pub fn servable(set: &CommandSet, supported: &impl Fn(&str) -> bool) -> CommandSet {
    set.iter()
        .filter(|cap| provider_methods_for(*cap).iter().all(|m| supported(m)))
        .collect()
}

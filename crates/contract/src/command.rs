//! (being written)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandCapability { Shell }
impl CommandCapability { pub fn as_str(self) -> &'static str { "shell" } }
#[derive(Debug)]
pub struct CommandSet;
pub const DEFAULT_CAPABILITIES: CommandSet = CommandSet;

//! The template model and the strict `template.yaml` parser.
//!
//! Fields: `name` (required), `capabilities` (optional list from the command
//! vocabulary; omitted = [`DEFAULT_CAPABILITIES`]), `provider`, `image`,
//! `rootfs`, `env`, `workdir`, `resources` (`memory`, `cpus`, `pids`, `disk`),
//! `network` (`none` or `egress`) and `timeout`.
//!
//! The parser fails closed: any error is an `Err` (E2xxx), never a template
//! with default capabilities. Unknown fields are rejected (typo protection),
//! null values are rejected (remove the field to leave it unset), duplicate
//! keys and duplicate capability tokens are rejected. Errors carry the line of
//! the offending node (`location` = `" at line N"`).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{Location, MessageFormatter, Spanned};

use crate::command::{CommandCapability, CommandSet, DEFAULT_CAPABILITIES};
use crate::error::ContractError;

/// Larger files are refused before parsing.
pub const MAX_TEMPLATE_BYTES: usize = 1024 * 1024;
/// Longest accepted `name`.
pub const MAX_NAME_LEN: usize = 128;

/// Every top-level field of `template.yaml`.
pub const TEMPLATE_FIELDS: &[&str] = &[
    "name",
    "capabilities",
    "provider",
    "image",
    "rootfs",
    "env",
    "workdir",
    "resources",
    "network",
    "timeout",
];

/// Every field of `resources:`.
pub const RESOURCE_FIELDS: &[&str] = &["memory", "cpus", "pids", "disk"];

/// A validated template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub name: String,
    /// `None` when `capabilities:` is omitted (the template inherits
    /// [`DEFAULT_CAPABILITIES`]); never `Some` of an empty set.
    pub declared_capabilities: Option<CommandSet>,
    pub provider: Option<String>,
    pub image: Option<String>,
    pub rootfs: Option<String>,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub resources: Resources,
    pub network: Network,
    pub timeout: Option<Duration>,
}

/// `resources:`; each limit is unset (`None`) unless declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resources {
    pub memory_bytes: Option<u64>,
    /// Thousandths of a CPU: `0.5` is 500.
    pub cpus_milli: Option<u32>,
    pub pids: Option<u32>,
    pub disk_bytes: Option<u64>,
}

/// `network:`; no network unless the template asks for egress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Network {
    #[default]
    None,
    Egress,
}

impl Network {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Egress => "egress",
        }
    }

    pub fn parse(token: &str) -> Option<Self> {
        match token {
            "none" => Some(Self::None),
            "egress" => Some(Self::Egress),
            _ => None,
        }
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Template {
    /// The built-in template used when none is given: named `default`,
    /// declaring nothing, so its capabilities are [`DEFAULT_CAPABILITIES`].
    pub fn builtin() -> Template {
        Template {
            name: "default".to_owned(),
            declared_capabilities: None,
            provider: None,
            image: None,
            rootfs: None,
            env: BTreeMap::new(),
            workdir: None,
            resources: Resources::default(),
            network: Network::None,
            timeout: None,
        }
    }

    /// The declared set, else [`DEFAULT_CAPABILITIES`].
    pub fn effective_capabilities(&self) -> CommandSet {
        self.declared_capabilities.unwrap_or(DEFAULT_CAPABILITIES)
    }

    /// The template in canonical `template.yaml` form: unset fields omitted,
    /// strings double-quoted, sizes in bytes, cpus in thousandths (`"1500m"`),
    /// the timeout in milliseconds. For a parsed template `t`,
    /// `parse_template(&t.to_yaml()) == Ok(t)`.
    pub fn to_yaml(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(out, "name: {}", quote(&self.name));
        if let Some(caps) = &self.declared_capabilities {
            let _ = writeln!(out, "capabilities: {}", caps.to_yaml_flow());
        }
        for (field, value) in [
            ("provider", &self.provider),
            ("image", &self.image),
            ("rootfs", &self.rootfs),
        ] {
            if let Some(v) = value {
                let _ = writeln!(out, "{field}: {}", quote(v));
            }
        }
        if !self.env.is_empty() {
            out.push_str("env:\n");
            for (k, v) in &self.env {
                let _ = writeln!(out, "  {}: {}", quote(k), quote(v));
            }
        }
        if let Some(w) = &self.workdir {
            let _ = writeln!(out, "workdir: {}", quote(w));
        }
        let r = &self.resources;
        if *r != Resources::default() {
            out.push_str("resources:\n");
            if let Some(m) = r.memory_bytes {
                let _ = writeln!(out, "  memory: {m}");
            }
            if let Some(c) = r.cpus_milli {
                let _ = writeln!(out, "  cpus: \"{c}m\"");
            }
            if let Some(p) = r.pids {
                let _ = writeln!(out, "  pids: {p}");
            }
            if let Some(d) = r.disk_bytes {
                let _ = writeln!(out, "  disk: {d}");
            }
        }
        if self.network != Network::None {
            let _ = writeln!(out, "network: {}", self.network);
        }
        if let Some(t) = self.timeout {
            let _ = writeln!(out, "timeout: \"{}ms\"", t.as_millis());
        }
        out
    }
}

/// A YAML double-quoted scalar; everything outside printable ASCII is escaped.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            c if u32::from(c) <= 0xFFFF => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push_str(&format!("\\U{:08X}", u32::from(c))),
        }
    }
    out.push('"');
    out
}

/// The effective command capabilities of a sandbox from its template
/// metadata; when the metadata is unavailable, [`DEFAULT_CAPABILITIES`].
pub fn effective_capabilities(metadata: Option<&Template>) -> CommandSet {
    metadata.map_or(DEFAULT_CAPABILITIES, Template::effective_capabilities)
}

/// Parses and validates a `template.yaml` document.
pub fn parse_template(text: &str) -> Result<Template, ContractError> {
    if text.len() > MAX_TEMPLATE_BYTES {
        return Err(ContractError::TemplateSyntax {
            location: String::new(),
            detail: format!("the file is larger than {MAX_TEMPLATE_BYTES} bytes"),
        });
    }
    let root = read_yaml(text)?;
    let entries = match root.value {
        Node::Map(entries) => entries,
        Node::Null => {
            return Err(ContractError::TemplateSyntax {
                location: String::new(),
                detail: "the document is empty; expected a mapping with at least `name`".into(),
            })
        }
        other => {
            return Err(ContractError::TemplateSyntax {
                location: at(&root.referenced),
                detail: format!(
                    "expected a mapping at the top level, found {}",
                    other.kind()
                ),
            })
        }
    };

    let mut t = Template::builtin();
    let mut name = None;
    for (field, value) in fields(entries, "")? {
        match field.as_str() {
            "name" => name = Some(validate_name(&value)?),
            "capabilities" => t.declared_capabilities = Some(parse_capabilities(value)?),
            "provider" => t.provider = Some(token_string(&value, "provider", 128)?),
            "image" => t.image = Some(token_string(&value, "image", 1024)?),
            "rootfs" => t.rootfs = Some(validate_rootfs(&value)?),
            "env" => t.env = parse_env(value)?,
            "workdir" => t.workdir = Some(validate_workdir(&value)?),
            "resources" => t.resources = parse_resources(value)?,
            "network" => t.network = parse_network(&value)?,
            "timeout" => t.timeout = Some(parse_timeout(&value)?),
            _ => unreachable!("fields() only yields known fields"),
        }
    }
    t.name = name.ok_or(ContractError::MissingTemplateField { field: "name" })?;
    Ok(t)
}

// ---------------------------------------------------------------------------
// YAML -> spanned node tree

/// An untyped YAML node; every child keeps its source location.
#[derive(Debug)]
enum Node {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Spanned<Node>>),
    Map(Vec<(Spanned<Node>, Spanned<Node>)>),
}

impl Node {
    fn kind(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool(_) => "a boolean",
            Node::Int(_) => "an integer",
            Node::Float(_) => "a number",
            Node::Str(_) => "a string",
            Node::Seq(_) => "a list",
            Node::Map(_) => "a mapping",
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(v.into()))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Node, E> {
        Ok(Node::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Int(v.into()))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Node, E> {
        i128::try_from(v)
            .map(Node::Int)
            .map_err(|_| E::custom("integer out of range"))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Node, E> {
        Ok(Node::Str(v))
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Node>>()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<Node>>()? {
            let value = map.next_value::<Spanned<Node>>()?;
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }
}

fn read_yaml(text: &str) -> Result<Spanned<Node>, ContractError> {
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: 32,
            max_nodes: 100_000,
        },
        strict_booleans: true,
        non_finite_float_policy: serde_saphyr::NonFiniteFloatPolicy::PassThrough,
        reject_unsupported_tags: true,
        merge_keys: serde_saphyr::MergeKeyPolicy::Error,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
        with_snippet: false,
    };
    serde_saphyr::from_str_with_options::<Spanned<Node>>(text, options).map_err(|e| {
        let location = e.location().map(|l| at_col(&l)).unwrap_or_default();
        let raw = serde_saphyr::UserMessageFormatter
            .format_message(&e)
            .into_owned();
        ContractError::TemplateSyntax {
            location,
            detail: tidy_message(&raw),
        }
    })
}

/// A dependency's message as one printable line (it may quote the input),
/// starting lowercase like every message of this crate.
fn tidy_message(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for c in raw.trim().trim_end_matches('.').chars() {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    let mut chars = out.chars();
    match (chars.next(), chars.next()) {
        (Some(first), Some(second)) if first.is_uppercase() && !second.is_uppercase() => {
            first.to_lowercase().chain(out.chars().skip(1)).collect()
        }
        _ => out,
    }
}

/// `" at line N"`, or nothing when the location is unknown.
fn at(loc: &Location) -> String {
    if loc.line() == 0 {
        String::new()
    } else {
        format!(" at line {}", loc.line())
    }
}

fn at_col(loc: &Location) -> String {
    if loc.line() == 0 {
        String::new()
    } else {
        format!(" at line {}, column {}", loc.line(), loc.column())
    }
}

fn invalid(field: &str, node: &Spanned<Node>, detail: impl Into<String>) -> ContractError {
    ContractError::InvalidTemplateField {
        field: field.to_owned(),
        location: at(&node.referenced),
        detail: detail.into(),
    }
}

/// Checks the keys of a mapping (the top level when `prefix` is empty,
/// `resources` otherwise): strings, known, not repeated. Yields (name, value).
fn fields(
    entries: Vec<(Spanned<Node>, Spanned<Node>)>,
    prefix: &str,
) -> Result<Vec<(String, Spanned<Node>)>, ContractError> {
    let known = if prefix.is_empty() {
        TEMPLATE_FIELDS
    } else {
        RESOURCE_FIELDS
    };
    let qualify = |k: &str| {
        if prefix.is_empty() {
            k.to_owned()
        } else {
            format!("{prefix}.{k}")
        }
    };
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut out = Vec::with_capacity(entries.len());
    for (key, value) in entries {
        let name = match &key.value {
            Node::Str(s) => s.clone(),
            Node::Int(i) => i.to_string(),
            Node::Bool(b) => b.to_string(),
            Node::Float(f) => f.to_string(),
            Node::Null => "null".to_owned(),
            other => other.kind().to_owned(),
        };
        if !matches!(key.value, Node::Str(_)) || !known.contains(&name.as_str()) {
            return Err(ContractError::UnknownTemplateField {
                field: qualify(&name.escape_debug().to_string()),
                location: at(&key.referenced),
            });
        }
        if let Some(first) = seen.insert(name.clone(), key.referenced.line()) {
            return Err(ContractError::InvalidTemplateField {
                field: qualify(&name),
                location: at(&key.referenced),
                detail: format!("the field is repeated (first at line {first})"),
            });
        }
        if matches!(value.value, Node::Null) {
            return Err(invalid(
                &qualify(&name),
                &value,
                "the value is null; remove the field to leave it unset",
            ));
        }
        out.push((name, value));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// field validators

fn string<'a>(node: &'a Spanned<Node>, field: &str) -> Result<&'a str, ContractError> {
    match &node.value {
        Node::Str(s) => Ok(s),
        other => Err(invalid(
            field,
            node,
            format!("must be a string, found {}", other.kind()),
        )),
    }
}

fn validate_name(node: &Spanned<Node>) -> Result<String, ContractError> {
    let s = string(node, "name")?;
    if s.is_empty() {
        return Err(invalid("name", node, "must not be empty"));
    }
    if s.chars().count() > MAX_NAME_LEN {
        return Err(invalid(
            "name",
            node,
            format!("must be at most {MAX_NAME_LEN} characters"),
        ));
    }
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if !s.starts_with(|c: char| c.is_ascii_alphanumeric()) || !s.chars().all(ok_char) {
        return Err(invalid(
            "name",
            node,
            format!(
                "`{}` must start with a letter or digit and use only letters, digits, `.`, `_` \
                 and `-`",
                s.escape_debug()
            ),
        ));
    }
    Ok(s.to_owned())
}

/// A non-empty single token: no whitespace, no control characters.
fn token_string(node: &Spanned<Node>, field: &str, max: usize) -> Result<String, ContractError> {
    let s = string(node, field)?;
    if s.is_empty() {
        return Err(invalid(field, node, "must not be empty"));
    }
    if s.len() > max {
        return Err(invalid(field, node, format!("must be at most {max} bytes")));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid(
            field,
            node,
            "must not contain whitespace or control characters",
        ));
    }
    Ok(s.to_owned())
}

fn validate_rootfs(node: &Spanned<Node>) -> Result<String, ContractError> {
    let s = string(node, "rootfs")?;
    if s.is_empty() {
        return Err(invalid("rootfs", node, "must not be empty"));
    }
    if s.chars().any(char::is_control) {
        return Err(invalid(
            "rootfs",
            node,
            "must not contain NUL or control characters",
        ));
    }
    Ok(s.to_owned())
}

fn validate_workdir(node: &Spanned<Node>) -> Result<String, ContractError> {
    let s = string(node, "workdir")?;
    if !s.starts_with('/') {
        return Err(invalid(
            "workdir",
            node,
            format!("must be an absolute path, found `{}`", s.escape_debug()),
        ));
    }
    if s.chars().any(char::is_control) {
        return Err(invalid(
            "workdir",
            node,
            "must not contain NUL or control characters",
        ));
    }
    if s.split('/').any(|part| part == "..") {
        return Err(invalid("workdir", node, "must not contain `..` components"));
    }
    Ok(s.to_owned())
}

fn parse_capabilities(node: Spanned<Node>) -> Result<CommandSet, ContractError> {
    let items = match node.value {
        Node::Seq(items) => items,
        ref other => {
            return Err(invalid(
                "capabilities",
                &node,
                format!(
                    "must be a list of capabilities such as {}, found {}",
                    DEFAULT_CAPABILITIES.to_yaml_flow(),
                    other.kind()
                ),
            ))
        }
    };
    if items.is_empty() {
        return Err(ContractError::InvalidTemplateField {
            field: "capabilities".to_owned(),
            location: at(&node.referenced),
            detail: format!(
                "must list at least one capability; omit the field to inherit the default {}",
                DEFAULT_CAPABILITIES.to_yaml_flow()
            ),
        });
    }
    let mut set = CommandSet::new();
    let mut first_line: BTreeMap<CommandCapability, u64> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let token = match &item.value {
            Node::Str(s) => s,
            other => {
                return Err(invalid(
                    &format!("capabilities[{i}]"),
                    item,
                    format!("must be a capability name, found {}", other.kind()),
                ))
            }
        };
        let cap = CommandCapability::parse(token).ok_or_else(|| {
            ContractError::UnknownCommandCapability {
                token: token.chars().flat_map(char::escape_debug).collect(),
                location: at(&item.referenced),
                known: CommandCapability::vocabulary_list(),
            }
        })?;
        if !set.insert(cap) {
            return Err(invalid(
                "capabilities",
                item,
                format!(
                    "`{cap}` is listed twice (first at line {})",
                    first_line[&cap]
                ),
            ));
        }
        first_line.insert(cap, item.referenced.line());
    }
    Ok(set)
}

fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_env(node: Spanned<Node>) -> Result<BTreeMap<String, String>, ContractError> {
    let entries = match node.value {
        Node::Map(entries) => entries,
        ref other => {
            return Err(invalid(
                "env",
                &node,
                format!(
                    "must be a mapping of NAME: \"value\", found {}",
                    other.kind()
                ),
            ))
        }
    };
    let mut env = BTreeMap::new();
    for (key, value) in entries {
        let name = match &key.value {
            Node::Str(s) => s.clone(),
            other => {
                return Err(invalid(
                    "env",
                    &key,
                    format!("variable names must be strings, found {}", other.kind()),
                ))
            }
        };
        let field = format!("env.{}", name.escape_debug());
        if !is_env_name(&name) {
            return Err(invalid(
                &field,
                &key,
                "a variable name must match [A-Za-z_][A-Za-z0-9_]* (no `=`, NUL or spaces)",
            ));
        }
        let text = match &value.value {
            Node::Str(s) => s.clone(),
            other => {
                return Err(invalid(
                    &field,
                    &value,
                    format!("must be a string (quote it), found {}", other.kind()),
                ))
            }
        };
        if text.contains('\0') {
            return Err(invalid(&field, &value, "must not contain NUL"));
        }
        if env.insert(name, text).is_some() {
            return Err(invalid(&field, &key, "the variable is repeated"));
        }
    }
    Ok(env)
}

fn parse_resources(node: Spanned<Node>) -> Result<Resources, ContractError> {
    let entries = match node.value {
        Node::Map(entries) => entries,
        ref other => {
            return Err(invalid(
                "resources",
                &node,
                format!(
                    "must be a mapping of memory, cpus, pids, disk, found {}",
                    other.kind()
                ),
            ))
        }
    };
    let mut r = Resources::default();
    for (field, value) in fields(entries, "resources")? {
        match field.as_str() {
            "memory" => r.memory_bytes = Some(size(&value, "resources.memory")?),
            "disk" => r.disk_bytes = Some(size(&value, "resources.disk")?),
            "cpus" => r.cpus_milli = Some(cpus(&value)?),
            "pids" => r.pids = Some(pids(&value)?),
            _ => unreachable!("fields() only yields known fields"),
        }
    }
    Ok(r)
}

const SIZE_SUFFIXES: &[(&str, u64)] = &[
    ("", 1),
    ("k", 1000),
    ("K", 1000),
    ("M", 1000 * 1000),
    ("G", 1000 * 1000 * 1000),
    ("T", 1000 * 1000 * 1000 * 1000),
    ("P", 1000 * 1000 * 1000 * 1000 * 1000),
    ("E", 1000 * 1000 * 1000 * 1000 * 1000 * 1000),
    ("Ki", 1 << 10),
    ("Mi", 1 << 20),
    ("Gi", 1 << 30),
    ("Ti", 1 << 40),
    ("Pi", 1 << 50),
    ("Ei", 1 << 60),
];

/// Parses a byte size: plain bytes (`1048576`) or a whole number with a
/// binary (`Ki` .. `Ei`) or decimal (`k`/`K`, `M` .. `E`) suffix. Positive.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(digits_end);
    let multiplier = SIZE_SUFFIXES
        .iter()
        .find(|(sfx, _)| *sfx == suffix)
        .map(|(_, m)| *m);
    let (Some(multiplier), false) = (multiplier, digits.is_empty()) else {
        return Err(format!(
            "`{}` is not a size: use bytes or a whole number with a suffix Ki, Mi, Gi, Ti, Pi, \
             Ei (binary) or k, M, G, T, P, E (decimal), e.g. \"512Mi\"",
            s.escape_debug()
        ));
    };
    let n: u64 = digits.parse().map_err(|_| format!("`{s}` is too large"))?;
    let bytes = n
        .checked_mul(multiplier)
        .ok_or_else(|| format!("`{s}` is too large"))?;
    if bytes == 0 {
        return Err("must be greater than zero".into());
    }
    Ok(bytes)
}

fn size(node: &Spanned<Node>, field: &str) -> Result<u64, ContractError> {
    match &node.value {
        Node::Int(i) if *i <= 0 => Err(invalid(field, node, "must be greater than zero")),
        Node::Int(i) => u64::try_from(*i).map_err(|_| invalid(field, node, "is too large")),
        Node::Str(s) => parse_size(s).map_err(|d| invalid(field, node, d)),
        other => Err(invalid(
            field,
            node,
            format!(
                "must be bytes or a size such as \"512Mi\", found {}",
                other.kind()
            ),
        )),
    }
}

/// Parses a CPU count into thousandths: `1`, `0.5`, `"1.5"`, `"250m"`.
/// Positive, at most three decimal places.
pub fn parse_cpus(s: &str) -> Result<u32, String> {
    let bad = || {
        format!(
            "`{}` is not a CPU count: use a number such as 0.5, 1 or \"1.5\", or \
             thousandths such as \"250m\"",
            s.escape_debug()
        )
    };
    let milli: u64 = if let Some(m) = s.strip_suffix('m') {
        if m.is_empty() || !m.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        m.parse().map_err(|_| "is too large".to_owned())?
    } else {
        let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
        let digits_only = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
        if (whole.is_empty() && frac.is_empty()) || !digits_only(whole) || !digits_only(frac) {
            return Err(bad());
        }
        if s.ends_with('.') {
            return Err(bad());
        }
        if frac.len() > 3 {
            return Err("must have at most three decimal places".into());
        }
        let whole: u64 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| "is too large".to_owned())?
        };
        let frac: u64 = format!("{frac:0<3}").parse().map_err(|_| bad())?;
        whole
            .checked_mul(1000)
            .and_then(|w| w.checked_add(frac))
            .ok_or_else(|| "is too large".to_owned())?
    };
    if milli == 0 {
        return Err("must be greater than zero".into());
    }
    u32::try_from(milli).map_err(|_| "is too large".to_owned())
}

fn cpus(node: &Spanned<Node>) -> Result<u32, ContractError> {
    let field = "resources.cpus";
    match &node.value {
        Node::Int(i) if *i <= 0 => Err(invalid(field, node, "must be greater than zero")),
        Node::Int(i) => i
            .checked_mul(1000)
            .and_then(|m| u32::try_from(m).ok())
            .ok_or_else(|| invalid(field, node, "is too large")),
        Node::Float(f) => {
            if !f.is_finite() || *f <= 0.0 {
                return Err(invalid(
                    field,
                    node,
                    "must be a finite number greater than zero",
                ));
            }
            let scaled = f * 1000.0;
            let milli = scaled.round();
            if (scaled - milli).abs() > 1e-6 * scaled.max(1.0) {
                return Err(invalid(
                    field,
                    node,
                    "must have at most three decimal places",
                ));
            }
            if milli < 1.0 {
                return Err(invalid(field, node, "must be at least 0.001"));
            }
            if milli > f64::from(u32::MAX) {
                return Err(invalid(field, node, "is too large"));
            }
            // In range and integral: the cast is exact.
            Ok(milli as u32)
        }
        Node::Str(s) => parse_cpus(s).map_err(|d| invalid(field, node, d)),
        other => Err(invalid(
            field,
            node,
            format!(
                "must be a number such as 0.5, 1 or \"1.5\", found {}",
                other.kind()
            ),
        )),
    }
}

fn pids(node: &Spanned<Node>) -> Result<u32, ContractError> {
    let field = "resources.pids";
    match &node.value {
        Node::Int(i) if *i <= 0 => Err(invalid(field, node, "must be greater than zero")),
        Node::Int(i) => u32::try_from(*i).map_err(|_| invalid(field, node, "is too large")),
        other => Err(invalid(
            field,
            node,
            format!("must be a positive integer, found {}", other.kind()),
        )),
    }
}

fn parse_network(node: &Spanned<Node>) -> Result<Network, ContractError> {
    let s = string(node, "network")?;
    Network::parse(s).ok_or_else(|| {
        invalid(
            "network",
            node,
            format!("must be `none` or `egress`, found `{}`", s.escape_debug()),
        )
    })
}

/// Parses a duration: whole seconds (`"90"`) or whole numbers with units
/// `h`, `m`, `s`, `ms`, optionally combined (`"30s"`, `"5m"`, `"1h30m"`).
/// Positive.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "`{}` is not a duration: use whole seconds or a value such as \"30s\", \"5m\", \
             \"1h30m\"",
            s.escape_debug()
        )
    };
    if s.is_empty() {
        return Err(bad());
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        let secs: u64 = s.parse().map_err(|_| "is too large".to_owned())?;
        return positive(Duration::from_secs(secs));
    }
    let mut total_ms: u64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits_end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits_end == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits_end]
            .parse()
            .map_err(|_| "is too large".to_owned())?;
        rest = &rest[digits_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let per_ms: u64 = match &rest[..unit_end] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(bad()),
        };
        rest = &rest[unit_end..];
        total_ms = n
            .checked_mul(per_ms)
            .and_then(|ms| ms.checked_add(total_ms))
            .ok_or_else(|| "is too large".to_owned())?;
    }
    positive(Duration::from_millis(total_ms))
}

fn positive(d: Duration) -> Result<Duration, String> {
    if d.is_zero() {
        Err("must be greater than zero; omit the field for no template timeout".into())
    } else {
        Ok(d)
    }
}

fn parse_timeout(node: &Spanned<Node>) -> Result<Duration, ContractError> {
    let field = "timeout";
    match &node.value {
        Node::Int(i) if *i <= 0 => Err(invalid(
            field,
            node,
            "must be greater than zero; omit the field for no template timeout",
        )),
        Node::Int(i) => u64::try_from(*i)
            .map(Duration::from_secs)
            .map_err(|_| invalid(field, node, "is too large")),
        Node::Str(s) => parse_duration(s).map_err(|d| invalid(field, node, d)),
        other => Err(invalid(
            field,
            node,
            format!(
                "must be whole seconds or a duration such as \"30s\", found {}",
                other.kind()
            ),
        )),
    }
}

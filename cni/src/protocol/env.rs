//! The `CNI_*` environment a runtime sets, validated per command.

use super::error::{CniError, code};
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Status,
    Gc,
}

impl Command {
    pub fn parse(s: &str) -> Option<Command> {
        match s {
            "ADD" => Some(Command::Add),
            "DEL" => Some(Command::Del),
            "CHECK" => Some(Command::Check),
            "VERSION" => Some(Command::Version),
            "STATUS" => Some(Command::Status),
            "GC" => Some(Command::Gc),
            _ => None,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Status => "STATUS",
            Command::Gc => "GC",
        }
    }
}

/// `CNI_ARGS`: `K=V;K2=V2` pairs, order kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs(pub Vec<(String, String)>);

impl CniArgs {
    pub fn parse(s: &str) -> Result<CniArgs, CniArgsError> {
        let mut out = Vec::new();
        for pair in s.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| CniArgsError::NoEquals(pair.to_string()))?;
            if k.is_empty() {
                return Err(CniArgsError::EmptyKey(pair.to_string()));
            }
            out.push((k.to_string(), v.to_string()));
        }
        Ok(CniArgs(out))
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn to_env_string(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(";")
    }
}

/// A `CNI_ARGS` pair that is not `K=V`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CniArgsError {
    #[error("pair {0:?} has no '='")]
    NoEquals(String),
    #[error("pair {0:?} has an empty key")]
    EmptyKey(String),
}

/// The runtime's request environment. Which fields are present depends on
/// the command (the spec's table); [`CniEnv::parse`] enforces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniEnv {
    pub command: Command,
    pub container_id: Option<String>,
    pub netns: Option<PathBuf>,
    pub ifname: Option<String>,
    pub args: CniArgs,
    pub path: Vec<PathBuf>,
}

fn env_err(msg: String) -> CniError {
    CniError::new(code::INVALID_ENV, msg)
}

/// Linux interface name rules: 1-15 bytes, not `.`/`..`, no `/`, `:` or
/// whitespace (the kernel's `dev_valid_name`).
pub fn validate_ifname(name: &str) -> Result<(), IfnameError> {
    if name.is_empty() {
        return Err(IfnameError::Empty);
    }
    if name.len() > 15 {
        return Err(IfnameError::TooLong(name.len()));
    }
    if name == "." || name == ".." {
        return Err(IfnameError::Dots);
    }
    if let Some(c) = name
        .chars()
        .find(|c| *c == '/' || *c == ':' || c.is_whitespace() || c.is_control())
    {
        return Err(IfnameError::Char(c));
    }
    Ok(())
}

/// Why a name is not a Linux interface name. The text reads after "it"
/// (the caller names the variable and the value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IfnameError {
    #[error("is empty")]
    Empty,
    #[error("is {0} bytes, the limit is 15")]
    TooLong(usize),
    #[error("cannot be '.' or '..'")]
    Dots,
    #[error("contains {0:?}")]
    Char(char),
}

/// Container IDs name state files: the spec's alphabet (alphanumerics, `_`,
/// `.`, `-`, starting alphanumeric).
pub fn validate_container_id(id: &str) -> Result<(), ContainerIdError> {
    let mut chars = id.chars();
    match chars.next() {
        None => return Err(ContainerIdError::Empty),
        Some(c) if !c.is_ascii_alphanumeric() => return Err(ContainerIdError::First(c)),
        _ => {}
    }
    if id.len() > 200 {
        return Err(ContainerIdError::TooLong(id.len()));
    }
    if let Some(c) = chars.find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))) {
        return Err(ContainerIdError::Char(c));
    }
    Ok(())
}

/// Why a string is not a container ID (the caller names the value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ContainerIdError {
    #[error("is empty")]
    Empty,
    #[error("must start with a letter or digit, not {0:?}")]
    First(char),
    #[error("is {0} bytes, the limit is 200")]
    TooLong(usize),
    #[error("contains {0:?} (allowed: letters, digits, '_', '.', '-')")]
    Char(char),
}

impl CniEnv {
    /// Reads the environment through `get` (so tests pass a map).
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<CniEnv, CniError> {
        let non_empty = |k: &str| get(k).filter(|v| !v.is_empty());
        let command_s =
            non_empty("CNI_COMMAND").ok_or_else(|| env_err("CNI_COMMAND is not set".into()))?;
        let command = Command::parse(&command_s).ok_or_else(|| {
            env_err(format!(
                "CNI_COMMAND {command_s:?} is not one of ADD, DEL, CHECK, VERSION, STATUS, GC"
            ))
        })?;
        let (need_cid, need_netns, need_ifname) = match command {
            Command::Add | Command::Check => (true, true, true),
            Command::Del => (true, false, true),
            Command::Version | Command::Status | Command::Gc => (false, false, false),
        };
        let container_id = non_empty("CNI_CONTAINERID");
        if need_cid && container_id.is_none() {
            return Err(env_err(format!(
                "CNI_CONTAINERID is required for {}",
                command.as_str()
            )));
        }
        if let Some(id) = &container_id {
            validate_container_id(id)
                .map_err(|e| env_err(format!("CNI_CONTAINERID {id:?} {e}")))?;
        }
        let netns = non_empty("CNI_NETNS").map(PathBuf::from);
        if need_netns && netns.is_none() {
            return Err(env_err(format!(
                "CNI_NETNS is required for {}",
                command.as_str()
            )));
        }
        if let Some(ns) = &netns
            && !ns.is_absolute()
        {
            return Err(env_err(format!(
                "CNI_NETNS {:?} is not an absolute path",
                ns.display()
            )));
        }
        let ifname = non_empty("CNI_IFNAME");
        if need_ifname && ifname.is_none() {
            return Err(env_err(format!(
                "CNI_IFNAME is required for {}",
                command.as_str()
            )));
        }
        if let Some(name) = &ifname {
            validate_ifname(name).map_err(|e| {
                env_err(format!(
                    "CNI_IFNAME {name:?} is not a valid interface name: it {e}"
                ))
            })?;
        }
        let args = match get("CNI_ARGS") {
            None => CniArgs::default(),
            Some(s) => CniArgs::parse(&s).map_err(|e| env_err(format!("CNI_ARGS: {e}")))?,
        };
        let path = get("CNI_PATH")
            .map(|p| {
                p.split(':')
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default();
        Ok(CniEnv {
            command,
            container_id,
            netns,
            ifname,
            args,
            path,
        })
    }

    /// Container ID of an attachment command (checked present by `parse`).
    pub fn container_id(&self) -> &str {
        self.container_id.as_deref().unwrap_or_default()
    }

    pub fn ifname(&self) -> &str {
        self.ifname.as_deref().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(pairs: &[(&str, &str)]) -> Result<CniEnv, CniError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CniEnv::parse(|k| m.get(k).cloned())
    }

    #[test]
    fn add_needs_everything() {
        let full = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "abc123"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "net1"),
            ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
            ("CNI_ARGS", "K8S_POD_NAME=p;MAC=02:00:00:00:00:01"),
        ];
        let env = parse(&full).unwrap();
        assert_eq!(env.command, Command::Add);
        assert_eq!(env.path.len(), 2);
        assert_eq!(env.args.get("MAC"), Some("02:00:00:00:00:01"));
        for missing in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"] {
            let partial: Vec<_> = full
                .iter()
                .copied()
                .filter(|(k, _)| *k != missing)
                .collect();
            let e = parse(&partial).unwrap_err();
            assert_eq!(e.code, code::INVALID_ENV);
            assert!(e.msg.contains(missing), "{e}");
        }
    }

    #[test]
    fn del_does_not_need_netns_and_version_needs_nothing() {
        let env = parse(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "net1"),
        ])
        .unwrap();
        assert!(env.netns.is_none());
        assert!(parse(&[("CNI_COMMAND", "VERSION")]).is_ok());
    }

    #[test]
    fn bad_values_are_named() {
        let e = parse(&[("CNI_COMMAND", "FROB")]).unwrap_err();
        assert!(e.msg.contains("FROB"));
        let e = parse(&[]).unwrap_err();
        assert!(e.msg.contains("CNI_COMMAND"));
        for bad_if in ["", "a/b", "toolonginterface0", "..", "a b", "x:y"] {
            let r = parse(&[
                ("CNI_COMMAND", "DEL"),
                ("CNI_CONTAINERID", "abc"),
                ("CNI_IFNAME", bad_if),
            ]);
            let e = r.unwrap_err();
            assert_eq!(e.code, code::INVALID_ENV);
            assert!(e.msg.contains("CNI_IFNAME"), "{e}");
        }
        for bad_id in ["../x", "-abc", "a/b", "a b"] {
            let e = parse(&[
                ("CNI_COMMAND", "DEL"),
                ("CNI_CONTAINERID", bad_id),
                ("CNI_IFNAME", "net1"),
            ])
            .unwrap_err();
            assert!(e.msg.contains("CNI_CONTAINERID"), "{e}");
        }
        let e = parse(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_NETNS", "relative/ns"),
            ("CNI_IFNAME", "net1"),
        ])
        .unwrap_err();
        assert!(e.msg.contains("absolute"), "{e}");
        let e = parse(&[("CNI_COMMAND", "GC"), ("CNI_ARGS", "novalue")]).unwrap_err();
        assert!(e.msg.contains("CNI_ARGS"), "{e}");
    }
}

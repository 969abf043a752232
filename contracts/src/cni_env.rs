//! Where kroce-cni finds the node: environment variables read by the
//! plugin binary (containerd, CRI-O and Multus run CNI plugins with the
//! runtime's own environment plus `CNI_*`), never keys of the network
//! config, which a namespace admin writes (issue 19). Whoever installs the
//! plugin sets them in the runtime's environment (tests do); unset, the
//! compiled-in defaults are the real node's.

/// Where `sys/`, `proc/` and `dev/` are. Default `/`.
pub const HOST_ROOT: &str = "KROCE_CNI_HOST_ROOT";
/// sysfs, when not `<host root>/sys`.
pub const SYSFS_ROOT: &str = "KROCE_CNI_SYSFS_ROOT";
/// procfs, when not `<host root>/proc`.
pub const PROC_ROOT: &str = "KROCE_CNI_PROC_ROOT";
/// The state dir (claims, locks, memlock requests). Default
/// [`crate::DEFAULT_STATE_DIR`]. Must be root's, mode 0700 or stricter.
pub const STATE_DIR: &str = "KROCE_CNI_STATE_DIR";
/// A log file (appended) for `logLevel` lines; unset: stderr only (which
/// runtimes put in their own log).
pub const LOG_FILE: &str = "KROCE_CNI_LOG_FILE";

/// Every variable above, for messages and docs.
pub const ALL: &[&str] = &[HOST_ROOT, SYSFS_ROOT, PROC_ROOT, STATE_DIR, LOG_FILE];

/// The network config keys that once named host paths and are refused now
/// (`code 7`, naming the key, before any side effect).
pub const REFUSED_CONFIG_KEYS: &[&str] =
    &["hostRoot", "sysfsRoot", "procRoot", "stateDir", "logFile"];

//! The CNI protocol: environment, versions, error objects and results as
//! the spec (1.1.0, 1.0.0, 0.4.0) lays them out. Plain data and pure
//! functions only.

pub mod env;
pub mod error;
pub mod result;
pub mod version;

pub use env::{CniArgs, CniEnv, Command};
pub use error::{CniError, code};
pub use result::{CniResult, Dns, Interface, IpConfig, Route};
pub use version::CniVersion;

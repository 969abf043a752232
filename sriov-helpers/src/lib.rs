//! kroce's host model: what a node's PCI, network and RDMA hardware looks
//! like, read from sysfs/procfs/dev trees under a root given as a value.
//!
//! Everything here is plain reading and a few writes (`sriov_numvfs`, IRQ
//! affinity); selection, allocation and planning live in the crates that use
//! it. With the `testing` feature, [`fixture`] lays out realistic fixture
//! hosts (ConnectX-6 Dx PFs with VFs, rxe soft devices, broken hosts).

pub mod cpulist;
pub mod error;
pub mod host;
pub mod irq;
pub mod netdev;
pub mod numa;
pub mod pci;
pub mod rdma;
pub mod root;
mod sysfs_io;
pub mod vf_range;

#[cfg(feature = "testing")]
pub mod fixture;

/// Implements serde's `Serialize`/`Deserialize` through `Display`/`FromStr`:
/// the kernel's text form is the wire form (PCI addresses, CPU lists, VF
/// ranges, MACs), so JSON, YAML and sysfs agree and parse errors stay ours.
#[macro_export]
macro_rules! serde_via_str {
    ($t:ty) => {
        impl $crate::__serde::Serialize for $t {
            fn serialize<S: $crate::__serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> $crate::__serde::Deserialize<'de> for $t {
            fn deserialize<D: $crate::__serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <String as $crate::__serde::Deserialize>::deserialize(d)?;
                s.parse().map_err($crate::__serde::de::Error::custom)
            }
        }
    };
}

#[doc(hidden)]
pub use serde as __serde;

pub use cpulist::CpuList;
pub use error::{HostError, ParseError};
pub use host::{Host, ScanOptions};
pub use netdev::Netdev;
pub use numa::NumaNode;
pub use pci::{PciAddress, PciDevice};
pub use rdma::{CharDevice, CharDevices, RdmaDevice, RdmaPort};
pub use root::HostRoot;
pub use vf_range::PfSelector;

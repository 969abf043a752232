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

pub use cpulist::CpuList;
pub use error::{HostError, ParseError};
pub use host::{Host, ScanOptions};
pub use netdev::Netdev;
pub use numa::NumaNode;
pub use pci::{PciAddress, PciDevice};
pub use rdma::{CharDevice, CharDevices, RdmaDevice, RdmaPort};
pub use root::HostRoot;
pub use vf_range::PfSelector;

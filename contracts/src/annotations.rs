//! Container annotations the device plugin sets in `Allocate` and kroce-nri
//! reads when a container is created.
//!
//! - `kroce.io/rdma-devices.<res>`: comma-separated device IDs allocated
//!   from resource `<res>` (`rdma/vf` is spelled `rdma_vf`: an annotation
//!   key allows only one '/').
//! - `kroce.io/memlock.<res>`: the pool's memlock limit, in the canonical
//!   form of [`crate::Memlock`]'s `Display` (`unlimited` or bytes), parsed
//!   back with the one grammar.

use crate::resource_name::ResourceName;

/// Prefix of the annotation listing a container's kroce RDMA devices.
pub const DEVICES_ANNOTATION_PREFIX: &str = "kroce.io/rdma-devices.";
/// Prefix of the annotation carrying the memlock a resource asks for.
pub const MEMLOCK_ANNOTATION_PREFIX: &str = "kroce.io/memlock.";

/// `kroce.io/rdma-devices.<res>`.
pub fn devices(resource: &ResourceName) -> String {
    format!("{DEVICES_ANNOTATION_PREFIX}{}", resource.underscored())
}

/// `kroce.io/memlock.<res>`.
pub fn memlock(resource: &ResourceName) -> String {
    format!("{MEMLOCK_ANNOTATION_PREFIX}{}", resource.underscored())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_under_the_vendor_domain_with_one_slash() {
        for r in ["rdma/vf", "example.com/rdma_a"] {
            let r = ResourceName::parse(r).expect("name");
            for key in [devices(&r), memlock(&r)] {
                assert!(
                    key.starts_with(crate::resource_name::VENDOR_DOMAIN),
                    "{key}"
                );
                assert_eq!(key.matches('/').count(), 1, "{key}");
            }
        }
        let r = ResourceName::parse("vf").expect("vf");
        assert_eq!(devices(&r), "kroce.io/rdma-devices.rdma_vf");
        assert_eq!(memlock(&r), "kroce.io/memlock.rdma_vf");
    }
}

//! Which containers get which memlock limit: a plain function over plain data.
//!
//! A container holds kroce RDMA devices when the kroce device plugin annotated
//! it in `Allocate` (`kroce.io/rdma-devices.<res>`, optionally
//! `kroce.io/memlock.<res>`) or when it has device nodes under
//! `/dev/infiniband/`, or when it holds a claim of kroce's DRA driver (the
//! claim's CDI spec put `KROCE_DRA_CLAIM_<UID>` in its env). Containers of a
//! sandbox for which kroce-cni recorded a memlock request are covered too.
//! Everything else is never touched.
//!
//! The limit is the largest explicit request (the memlock annotations, the
//! sandbox's CNI request and the memlock requests of the DRA claims the
//! container holds); the node default applies only when there is none,
//! so a network asking for 1 GiB gets 1 GiB even under a default of
//! `unlimited`. A limit already in the container's spec is never lowered.

use std::collections::BTreeMap;

use crate::memlock::Memlock;
use crate::proto::api;
pub use crate::runtime::RuntimeLimits;

/// The annotations the device plugin sets in `Allocate`:
/// `kroce.io/rdma-devices.<res>` (the device IDs) and `kroce.io/memlock.<res>`
/// (the pool's limit, in the one memlock grammar). Named in
/// [`kroce_contracts::annotations`], shared with the writer.
pub use kroce_contracts::annotations::{DEVICES_ANNOTATION_PREFIX, MEMLOCK_ANNOTATION_PREFIX};
/// The env a DRA claim's CDI spec sets (`KROCE_DRA_CLAIM_<UID>`), named and
/// parsed in [`kroce_contracts::dra`], shared with the DRA plugin.
pub use kroce_contracts::dra::claim_uid_of_env;
/// RDMA character devices (uverbs, umad, rdma_cm) live here in a container.
pub const RDMA_DEVICE_DIR: &str = "/dev/infiniband/";
/// The OCI rlimit name.
pub const RLIMIT_MEMLOCK: &str = "RLIMIT_MEMLOCK";

/// An rlimit pair as the container spec has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rlimit {
    pub soft: u64,
    pub hard: u64,
}

/// What the policy needs to know about a container, as plain data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerFacts {
    pub id: String,
    pub sandbox_id: String,
    pub annotations: BTreeMap<String, String>,
    /// Container-side paths of its linux device nodes.
    pub device_paths: Vec<String>,
    /// UIDs of the DRA claims it holds (from its claim env), sorted.
    pub dra_claims: Vec<String>,
    /// `RLIMIT_MEMLOCK` already in the container's spec, if any.
    pub existing_memlock: Option<Rlimit>,
}

impl ContainerFacts {
    /// Extracts the facts from the NRI container (and its pod, for the sandbox
    /// ID when the container does not carry it).
    pub fn from_nri(container: &api::Container, pod: Option<&api::PodSandbox>) -> Self {
        let sandbox_id = if container.pod_sandbox_id.is_empty() {
            pod.map(|p| p.id.clone()).unwrap_or_default()
        } else {
            container.pod_sandbox_id.clone()
        };
        let device_paths = container
            .linux
            .as_ref()
            .map(|l| l.devices.iter().map(|d| d.path.clone()).collect())
            .unwrap_or_default();
        let existing_memlock = container
            .rlimits
            .iter()
            .rev() // the last entry of a type wins in runc
            .find(|r| r.r#type == RLIMIT_MEMLOCK)
            .map(|r| Rlimit {
                soft: r.soft,
                hard: r.hard,
            });
        let mut dra_claims: Vec<String> = container
            .env
            .iter()
            .filter_map(|e| claim_uid_of_env(e))
            .collect();
        dra_claims.sort_unstable();
        dra_claims.dedup();
        ContainerFacts {
            id: container.id.clone(),
            sandbox_id,
            annotations: container.annotations.clone(),
            device_paths,
            dra_claims,
            existing_memlock,
        }
    }
}

/// Why a container was recognised as an RDMA container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Evidence {
    DevicesAnnotation {
        key: String,
        devices: String,
    },
    MemlockAnnotation {
        key: String,
        value: Memlock,
    },
    DeviceNode {
        path: String,
    },
    CniRequest {
        sandbox_id: String,
        value: Memlock,
    },
    /// It holds this DRA claim; `value`: the claim's memlock request, if
    /// it has one.
    DraClaim {
        claim_uid: String,
        value: Option<Memlock>,
    },
}

/// What to do with a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Not an RDMA container: no adjustment at all.
    Untouched,
    /// Set `RLIMIT_MEMLOCK` soft = hard = this limit.
    Set(Memlock),
    /// Its spec already allows at least `wanted`: leave it.
    AlreadySufficient { existing: Rlimit, wanted: Memlock },
    /// Set soft = hard = `granted`, the runtime's own hard limit, which is
    /// less than `requested`: the runtime cannot raise a hard limit (no
    /// `CAP_SYS_RESOURCE` in the initial user namespace), and asking for more
    /// would make runc fail the container.
    Capped {
        requested: Memlock,
        granted: Memlock,
    },
}

/// The decision for one container, with its reasons.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub action: Action,
    pub evidence: Vec<Evidence>,
    /// Problems with the inputs (bad annotation values), worth a log line.
    pub warnings: Vec<String>,
}

/// Decides the memlock limit for `container`.
///
/// `cni_request` is the memlock kroce-cni recorded for the container's sandbox
/// (if any); `dra_requests` the memlock requests the DRA plugin recorded, by
/// claim UID (only the claims in `container.dra_claims` count); `default` is
/// the node default (`--default-memlock`), used only when no annotation, CNI
/// request or claim asks for a limit.
pub fn decide(
    container: &ContainerFacts,
    cni_request: Option<Memlock>,
    dra_requests: &BTreeMap<String, Memlock>,
    default: Memlock,
) -> Decision {
    let mut evidence = Vec::new();
    let mut warnings = Vec::new();
    // The largest explicit request; the default only fills in when none.
    let mut explicit: Option<Memlock> = None;

    for (key, value) in &container.annotations {
        if key.starts_with(DEVICES_ANNOTATION_PREFIX) {
            if value.trim().is_empty() {
                warnings.push(format!(
                    "annotation {key} is empty; not counted as RDMA devices"
                ));
            } else {
                evidence.push(Evidence::DevicesAnnotation {
                    key: key.clone(),
                    devices: value.clone(),
                });
            }
        } else if key.starts_with(MEMLOCK_ANNOTATION_PREFIX) {
            match value.parse::<Memlock>() {
                Ok(limit) => {
                    explicit = explicit.max(Some(limit));
                    evidence.push(Evidence::MemlockAnnotation {
                        key: key.clone(),
                        value: limit,
                    });
                }
                Err(err) => warnings.push(format!("annotation {key}: {err}; ignored")),
            }
        }
    }
    for path in &container.device_paths {
        if path.starts_with(RDMA_DEVICE_DIR) {
            evidence.push(Evidence::DeviceNode { path: path.clone() });
        }
    }
    if let Some(limit) = cni_request {
        explicit = explicit.max(Some(limit));
        evidence.push(Evidence::CniRequest {
            sandbox_id: container.sandbox_id.clone(),
            value: limit,
        });
    }
    for uid in &container.dra_claims {
        let value = dra_requests.get(uid).copied();
        explicit = explicit.max(value);
        evidence.push(Evidence::DraClaim {
            claim_uid: uid.clone(),
            value,
        });
    }

    let wanted = explicit.unwrap_or(default);

    let action = if evidence.is_empty() {
        Action::Untouched
    } else {
        match container.existing_memlock {
            Some(existing)
                if Memlock::from_rlimit(existing.soft) >= wanted
                    && Memlock::from_rlimit(existing.hard) >= wanted =>
            {
                Action::AlreadySufficient { existing, wanted }
            }
            // Never lower a hard limit the spec already grants.
            Some(existing) => Action::Set(wanted.max(Memlock::from_rlimit(existing.hard))),
            None => Action::Set(wanted),
        }
    };
    Decision {
        action,
        evidence,
        warnings,
    }
}

/// [`decide`], then [`fit_to_runtime`]: what kroce-nri answers when it knows
/// (`Some`) or does not know (`None`) what the runtime can grant.
pub fn decide_for_runtime(
    container: &ContainerFacts,
    cni_request: Option<Memlock>,
    dra_requests: &BTreeMap<String, Memlock>,
    default: Memlock,
    runtime: Option<&RuntimeLimits>,
) -> Decision {
    let mut decision = decide(container, cni_request, dra_requests, default);
    decision.action = fit_to_runtime(decision.action, runtime);
    decision
}

/// Caps a limit to set at the runtime's hard limit when the runtime cannot
/// raise it. Unknown runtime limits leave the action as is (as before kroce
/// read them); so does a runtime that may raise its limits.
///
/// A spec limit above the runtime's hard limit is capped too: runc could not
/// apply it either.
pub fn fit_to_runtime(action: Action, runtime: Option<&RuntimeLimits>) -> Action {
    let ceiling = runtime.filter(|r| !r.can_raise()).map(|r| r.memlock_hard);
    match (action, ceiling) {
        (Action::Set(requested), Some(hard)) if requested > hard => Action::Capped {
            requested,
            granted: hard,
        },
        (other, _) => other,
    }
}

impl Decision {
    /// The limit this decision sets, if any.
    pub fn limit(&self) -> Option<Memlock> {
        match self.action {
            Action::Set(limit) | Action::Capped { granted: limit, .. } => Some(limit),
            Action::Untouched | Action::AlreadySufficient { .. } => None,
        }
    }

    /// The NRI adjustment for this decision (empty unless a limit is set).
    pub fn adjustment(&self) -> api::ContainerAdjustment {
        let mut adjust = api::ContainerAdjustment::default();
        if let Some(limit) = self.limit() {
            adjust.rlimits.push(api::PosixRlimit {
                r#type: RLIMIT_MEMLOCK.to_owned(),
                hard: limit.rlimit_value(),
                soft: limit.rlimit_value(),
            });
        }
        adjust
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// [`decide`] for a container without DRA requests to look at.
    fn decide_no_claims(c: &ContainerFacts, cni: Option<Memlock>, default: Memlock) -> Decision {
        decide(c, cni, &BTreeMap::new(), default)
    }

    fn facts(annotations: &[(&str, &str)], devices: &[&str]) -> ContainerFacts {
        ContainerFacts {
            id: "c1".into(),
            sandbox_id: "sb1".into(),
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            device_paths: devices.iter().map(|d| (*d).to_owned()).collect(),
            dra_claims: Vec::new(),
            existing_memlock: None,
        }
    }

    #[test]
    fn plain_container_is_untouched_even_with_a_default() {
        let d = decide_no_claims(
            &facts(
                &[("io.kubernetes.pod.name", "x")],
                &["/dev/fuse", "/dev/net/tun"],
            ),
            None,
            Memlock::Bytes(64 * MIB),
        );
        assert_eq!(d.action, Action::Untouched);
        assert!(d.evidence.is_empty());
        assert!(d.adjustment().rlimits.is_empty());
    }

    #[test]
    fn devices_annotation_gets_the_default() {
        let d = decide_no_claims(
            &facts(&[("kroce.io/rdma-devices.rdma_vf", "0000:3b:00.2")], &[]),
            None,
            Memlock::Unlimited,
        );
        assert_eq!(d.action, Action::Set(Memlock::Unlimited));
        let adj = d.adjustment();
        assert_eq!(adj.rlimits.len(), 1);
        assert_eq!(adj.rlimits[0].r#type, "RLIMIT_MEMLOCK");
        assert_eq!(adj.rlimits[0].hard, u64::MAX);
        assert_eq!(adj.rlimits[0].soft, u64::MAX);
    }

    #[test]
    fn infiniband_device_node_alone_is_enough() {
        let d = decide_no_claims(
            &facts(&[], &["/dev/infiniband/uverbs3"]),
            None,
            Memlock::Bytes(64 * MIB),
        );
        assert_eq!(d.action, Action::Set(Memlock::Bytes(64 * MIB)));
        assert_eq!(
            d.evidence,
            vec![Evidence::DeviceNode {
                path: "/dev/infiniband/uverbs3".into()
            }]
        );
        // A look-alike outside the directory is not.
        let d = decide_no_claims(&facts(&[], &["/dev/infiniband"]), None, Memlock::Unlimited);
        assert_eq!(d.action, Action::Untouched);
    }

    #[test]
    fn largest_explicit_request_wins() {
        let c = facts(
            &[
                ("kroce.io/rdma-devices.rdma_vf", "a,b"),
                ("kroce.io/memlock.rdma_vf", "1073741824"),
                ("kroce.io/memlock.rdma_other", "2147483648"),
            ],
            &[],
        );
        let d = decide_no_claims(
            &c,
            Some(Memlock::Bytes(512 * MIB)),
            Memlock::Bytes(64 * MIB),
        );
        assert_eq!(d.action, Action::Set(Memlock::Bytes(2048 * MIB)));
        let d = decide_no_claims(&c, Some(Memlock::Unlimited), Memlock::Bytes(64 * MIB));
        assert_eq!(d.action, Action::Set(Memlock::Unlimited));
        // Explicit requests exist: a larger default does not override them.
        let d = decide_no_claims(&c, None, Memlock::Bytes(8192 * MIB));
        assert_eq!(d.action, Action::Set(Memlock::Bytes(2048 * MIB)));
    }

    /// `--default-memlock` applies only when nothing explicit was asked for:
    /// an explicit request (annotation or CNI request) is taken as is, even
    /// below the default (issue 10, item 6).
    #[test]
    fn default_applies_only_without_an_explicit_request() {
        const GIB: u64 = 1 << 30;
        let devices = ("kroce.io/rdma-devices.rdma_vf", "0000:3b:00.2");
        // (what, annotations, CNI request, default, expected limit)
        type Row<'a> = (
            &'a str,
            Vec<(&'a str, &'a str)>,
            Option<Memlock>,
            Memlock,
            Memlock,
        );
        let table: &[Row] = &[
            (
                "explicit 1 GiB annotation, default unlimited",
                vec![devices, ("kroce.io/memlock.rdma_vf", "1073741824")],
                None,
                Memlock::Unlimited,
                Memlock::Bytes(GIB),
            ),
            (
                "explicit 1 GiB CNI request, default unlimited",
                vec![],
                Some(Memlock::Bytes(GIB)),
                Memlock::Unlimited,
                Memlock::Bytes(GIB),
            ),
            (
                "explicit 64 MiB annotation below an 8 GiB default",
                vec![devices, ("kroce.io/memlock.rdma_vf", "67108864")],
                None,
                Memlock::Bytes(8 * GIB),
                Memlock::Bytes(64 * MIB),
            ),
            (
                "two explicit requests: the larger",
                vec![devices, ("kroce.io/memlock.rdma_vf", "1073741824")],
                Some(Memlock::Bytes(2 * GIB)),
                Memlock::Unlimited,
                Memlock::Bytes(2 * GIB),
            ),
            (
                "devices only: the default",
                vec![devices],
                None,
                Memlock::Unlimited,
                Memlock::Unlimited,
            ),
            (
                "unparsable memlock annotation is not a request: the default",
                vec![devices, ("kroce.io/memlock.rdma_vf", "lots")],
                None,
                Memlock::Bytes(64 * MIB),
                Memlock::Bytes(64 * MIB),
            ),
        ];
        for (what, annotations, cni, default, want) in table {
            let d = decide_no_claims(&facts(annotations, &[]), *cni, *default);
            assert_eq!(d.action, Action::Set(*want), "{what}");
        }
    }

    /// The runtime applies the limit: when it cannot raise its hard limit,
    /// asking for more makes runc fail the container, so the request is capped
    /// at the runtime's hard limit (issue 10, item 5).
    #[test]
    fn limits_are_capped_at_what_the_runtime_can_set() {
        let runtime = |cap: bool, initial: bool, hard: Memlock| RuntimeLimits {
            pid: 1,
            cap_sys_resource: cap,
            initial_user_namespace: initial,
            memlock_soft: Memlock::Bytes(64 * 1024),
            memlock_hard: hard,
        };
        let rdma = facts(&[("kroce.io/rdma-devices.rdma_vf", "x")], &[]);
        let with_spec = |soft, hard| {
            let mut c = rdma.clone();
            c.existing_memlock = Some(Rlimit { soft, hard });
            c
        };
        let plain = facts(&[], &["/dev/fuse"]);
        let eight = Memlock::Bytes(8 * MIB);
        // (what, container, request (default), runtime, expected action)
        type Row<'a> = (
            &'a str,
            ContainerFacts,
            Memlock,
            Option<RuntimeLimits>,
            Action,
        );
        let table: Vec<Row> = vec![
            (
                "no CAP_SYS_RESOURCE, hard 8 MiB, unlimited asked: capped at 8 MiB",
                rdma.clone(),
                Memlock::Unlimited,
                Some(runtime(false, true, eight)),
                Action::Capped {
                    requested: Memlock::Unlimited,
                    granted: eight,
                },
            ),
            (
                "no CAP_SYS_RESOURCE, 1 GiB asked: capped at 8 MiB",
                rdma.clone(),
                Memlock::Bytes(1024 * MIB),
                Some(runtime(false, true, eight)),
                Action::Capped {
                    requested: Memlock::Bytes(1024 * MIB),
                    granted: eight,
                },
            ),
            (
                "no CAP_SYS_RESOURCE, 4 MiB asked, within the hard limit: as asked",
                rdma.clone(),
                Memlock::Bytes(4 * MIB),
                Some(runtime(false, true, eight)),
                Action::Set(Memlock::Bytes(4 * MIB)),
            ),
            (
                "no CAP_SYS_RESOURCE, exactly the hard limit: as asked",
                rdma.clone(),
                eight,
                Some(runtime(false, true, eight)),
                Action::Set(eight),
            ),
            (
                "no CAP_SYS_RESOURCE but hard unlimited: as asked",
                rdma.clone(),
                Memlock::Unlimited,
                Some(runtime(false, true, Memlock::Unlimited)),
                Action::Set(Memlock::Unlimited),
            ),
            (
                "CAP_SYS_RESOURCE in the initial user namespace: as asked",
                rdma.clone(),
                Memlock::Unlimited,
                Some(runtime(true, true, eight)),
                Action::Set(Memlock::Unlimited),
            ),
            (
                "CAP_SYS_RESOURCE in a user namespace (rootless): capped",
                rdma.clone(),
                Memlock::Unlimited,
                Some(runtime(true, false, Memlock::Bytes(64 * 1024))),
                Action::Capped {
                    requested: Memlock::Unlimited,
                    granted: Memlock::Bytes(64 * 1024),
                },
            ),
            (
                "runtime limits unknown: as asked",
                rdma.clone(),
                Memlock::Unlimited,
                None,
                Action::Set(Memlock::Unlimited),
            ),
            (
                "spec soft too low, spec hard above the runtime's: capped at the runtime's",
                with_spec(MIB, 16 * MIB),
                Memlock::Bytes(4 * MIB),
                Some(runtime(false, true, eight)),
                Action::Capped {
                    requested: Memlock::Bytes(16 * MIB),
                    granted: eight,
                },
            ),
            (
                "spec already sufficient: untouched, whatever the runtime",
                with_spec(u64::MAX, u64::MAX),
                Memlock::Bytes(4 * MIB),
                Some(runtime(false, true, eight)),
                Action::AlreadySufficient {
                    existing: Rlimit {
                        soft: u64::MAX,
                        hard: u64::MAX,
                    },
                    wanted: Memlock::Bytes(4 * MIB),
                },
            ),
            (
                "not an RDMA container: untouched",
                plain,
                Memlock::Unlimited,
                Some(runtime(false, true, eight)),
                Action::Untouched,
            ),
        ];
        for (what, container, default, rt, want) in table {
            let d = decide_for_runtime(&container, None, &BTreeMap::new(), default, rt.as_ref());
            assert_eq!(d.action, want, "{what}");
            let adj = d.adjustment();
            match want {
                Action::Set(l) | Action::Capped { granted: l, .. } => {
                    assert_eq!(adj.rlimits.len(), 1, "{what}");
                    assert_eq!(
                        (adj.rlimits[0].soft, adj.rlimits[0].hard),
                        (l.rlimit_value(), l.rlimit_value()),
                        "{what}"
                    );
                }
                Action::Untouched | Action::AlreadySufficient { .. } => {
                    assert!(adj.rlimits.is_empty(), "{what}");
                }
            }
        }
    }

    #[test]
    fn cni_request_alone_covers_the_sandbox_containers() {
        let d = decide_no_claims(
            &facts(&[], &[]),
            Some(Memlock::Bytes(256 * MIB)),
            Memlock::Bytes(0),
        );
        assert_eq!(d.action, Action::Set(Memlock::Bytes(256 * MIB)));
        assert_eq!(
            d.evidence,
            vec![Evidence::CniRequest {
                sandbox_id: "sb1".into(),
                value: Memlock::Bytes(256 * MIB)
            }]
        );
    }

    #[test]
    fn bad_memlock_annotation_is_a_warning_not_a_failure() {
        let d = decide_no_claims(
            &facts(
                &[
                    ("kroce.io/rdma-devices.rdma_vf", "x"),
                    ("kroce.io/memlock.rdma_vf", "lots"),
                ],
                &[],
            ),
            None,
            Memlock::Bytes(64 * MIB),
        );
        assert_eq!(d.action, Action::Set(Memlock::Bytes(64 * MIB)));
        assert_eq!(d.warnings.len(), 1);
        assert!(
            d.warnings[0].contains("kroce.io/memlock.rdma_vf"),
            "{:?}",
            d.warnings
        );
        assert!(d.warnings[0].contains("\"lots\""), "{:?}", d.warnings);
    }

    #[test]
    fn empty_devices_annotation_does_not_count() {
        let d = decide_no_claims(
            &facts(&[("kroce.io/rdma-devices.rdma_vf", " ")], &[]),
            None,
            Memlock::Unlimited,
        );
        assert_eq!(d.action, Action::Untouched);
        assert_eq!(d.warnings.len(), 1);
    }

    #[test]
    fn existing_larger_limit_is_kept_and_never_lowered() {
        let mut c = facts(&[], &["/dev/infiniband/uverbs0"]);
        c.existing_memlock = Some(Rlimit {
            soft: u64::MAX,
            hard: u64::MAX,
        });
        let d = decide_no_claims(&c, None, Memlock::Bytes(64 * MIB));
        assert!(matches!(d.action, Action::AlreadySufficient { .. }));
        assert!(d.adjustment().rlimits.is_empty());

        // Soft too low, hard high: raise soft, keep the higher hard.
        c.existing_memlock = Some(Rlimit {
            soft: MIB,
            hard: 128 * MIB,
        });
        let d = decide_no_claims(&c, None, Memlock::Bytes(64 * MIB));
        assert_eq!(d.action, Action::Set(Memlock::Bytes(128 * MIB)));

        // Both too low: set ours.
        c.existing_memlock = Some(Rlimit {
            soft: MIB,
            hard: 8 * MIB,
        });
        let d = decide_no_claims(&c, None, Memlock::Bytes(64 * MIB));
        assert_eq!(d.action, Action::Set(Memlock::Bytes(64 * MIB)));
    }

    const CLAIM_A: &str = "6c1d3e0a-0000-4000-8000-00000000000a";
    const CLAIM_B: &str = "6c1d3e0a-0000-4000-8000-00000000000b";

    fn holding(claims: &[&str]) -> ContainerFacts {
        let mut c = facts(&[], &[]);
        c.dra_claims = claims.iter().map(|u| (*u).to_owned()).collect();
        c
    }

    fn dra(requests: &[(&str, Memlock)]) -> BTreeMap<String, Memlock> {
        requests
            .iter()
            .map(|(u, m)| ((*u).to_owned(), *m))
            .collect()
    }

    /// A container holding a DRA claim gets the claim's memlock request
    /// (recorded by the DRA plugin), also below the node default; the
    /// requests of claims it does not hold do not count.
    #[test]
    fn a_dra_claims_memlock_goes_to_the_containers_holding_it() {
        let requests = dra(&[
            (CLAIM_A, Memlock::Bytes(4 * MIB)),
            (CLAIM_B, Memlock::Bytes(6 * MIB)),
        ]);
        // (what, claims held, CNI request, default, expected action)
        type Row<'a> = (&'a str, Vec<&'a str>, Option<Memlock>, Memlock, Action);
        let table: Vec<Row> = vec![
            (
                "claim A: its 4 MiB, not the unlimited default",
                vec![CLAIM_A],
                None,
                Memlock::Unlimited,
                Action::Set(Memlock::Bytes(4 * MIB)),
            ),
            (
                "claims A and B: the larger",
                vec![CLAIM_A, CLAIM_B],
                None,
                Memlock::Unlimited,
                Action::Set(Memlock::Bytes(6 * MIB)),
            ),
            (
                "claim A and a larger CNI request: the larger",
                vec![CLAIM_A],
                Some(Memlock::Bytes(8 * MIB)),
                Memlock::Unlimited,
                Action::Set(Memlock::Bytes(8 * MIB)),
            ),
            (
                "claim A over a smaller CNI request",
                vec![CLAIM_A],
                Some(Memlock::Bytes(MIB)),
                Memlock::Unlimited,
                Action::Set(Memlock::Bytes(4 * MIB)),
            ),
            (
                "a claim without a request: an RDMA container, the default",
                vec!["6c1d3e0a-0000-4000-8000-00000000000c"],
                None,
                Memlock::Bytes(2 * MIB),
                Action::Set(Memlock::Bytes(2 * MIB)),
            ),
            (
                "no claim: untouched, whatever requests other claims have",
                vec![],
                None,
                Memlock::Unlimited,
                Action::Untouched,
            ),
        ];
        for (what, claims, cni, default, want) in table {
            let d = decide(&holding(&claims), cni, &requests, default);
            assert_eq!(d.action, want, "{what}");
        }
        let d = decide(&holding(&[CLAIM_A]), None, &requests, Memlock::Unlimited);
        assert_eq!(
            d.evidence,
            vec![Evidence::DraClaim {
                claim_uid: CLAIM_A.into(),
                value: Some(Memlock::Bytes(4 * MIB))
            }]
        );
        assert_eq!(
            (
                d.adjustment().rlimits[0].soft,
                d.adjustment().rlimits[0].hard
            ),
            (4 * MIB, 4 * MIB)
        );
    }

    /// The claim's request is capped at the runtime's hard limit like any
    /// other, and a spec limit already above it is kept.
    #[test]
    fn a_dra_claims_memlock_is_capped_and_never_lowers_the_spec() {
        let requests = dra(&[(CLAIM_A, Memlock::Unlimited)]);
        let rt = RuntimeLimits {
            pid: 1,
            cap_sys_resource: false,
            initial_user_namespace: true,
            memlock_soft: Memlock::Bytes(8 * MIB),
            memlock_hard: Memlock::Bytes(8 * MIB),
        };
        let d = decide_for_runtime(
            &holding(&[CLAIM_A]),
            None,
            &requests,
            Memlock::Bytes(MIB),
            Some(&rt),
        );
        assert_eq!(
            d.action,
            Action::Capped {
                requested: Memlock::Unlimited,
                granted: Memlock::Bytes(8 * MIB)
            }
        );
        let mut c = holding(&[CLAIM_A]);
        c.existing_memlock = Some(Rlimit {
            soft: u64::MAX,
            hard: u64::MAX,
        });
        let d = decide(&c, None, &requests, Memlock::Bytes(MIB));
        assert!(
            matches!(d.action, Action::AlreadySufficient { .. }),
            "{d:?}"
        );
    }

    #[test]
    fn facts_from_nri_container_read_the_claim_env() {
        let container = api::Container {
            id: "ctr".into(),
            pod_sandbox_id: "sb".into(),
            env: vec![
                "PATH=/bin".into(),
                "KROCE_DRA_CLAIM_6C1D3E0A_0000_4000_8000_00000000000B=default/b".into(),
                "KROCE_DRA_VF_0000_3B_00_2_PCI_ADDRESS=0000:3b:00.2".into(),
                "KROCE_DRA_CLAIM_6C1D3E0A_0000_4000_8000_00000000000A=default/a".into(),
                "KROCE_DRA_CLAIM_6C1D3E0A_0000_4000_8000_00000000000A=default/a".into(),
            ],
            ..Default::default()
        };
        let f = ContainerFacts::from_nri(&container, None);
        assert_eq!(f.dra_claims, vec![CLAIM_A.to_owned(), CLAIM_B.to_owned()]);
        // The env name the DRA plugin's CDI spec sets is the one read here.
        assert_eq!(
            claim_uid_of_env(&kroce_contracts::dra::claim_env(CLAIM_A)).as_deref(),
            Some(CLAIM_A)
        );
    }

    #[test]
    fn facts_from_nri_container() {
        let container = api::Container {
            id: "ctr".into(),
            pod_sandbox_id: String::new(),
            annotations: [("kroce.io/rdma-devices.rdma_vf".to_owned(), "d".to_owned())].into(),
            linux: Some(api::LinuxContainer {
                devices: vec![api::LinuxDevice {
                    path: "/dev/infiniband/uverbs1".into(),
                    r#type: "c".into(),
                    major: 231,
                    minor: 193,
                    ..Default::default()
                }],
                ..Default::default()
            }),
            rlimits: vec![
                api::PosixRlimit {
                    r#type: "RLIMIT_NOFILE".into(),
                    hard: 1024,
                    soft: 1024,
                },
                api::PosixRlimit {
                    r#type: "RLIMIT_MEMLOCK".into(),
                    hard: 65536,
                    soft: 65536,
                },
            ],
            ..Default::default()
        };
        let pod = api::PodSandbox {
            id: "pod-sandbox".into(),
            ..Default::default()
        };
        let f = ContainerFacts::from_nri(&container, Some(&pod));
        assert_eq!(f.sandbox_id, "pod-sandbox");
        assert_eq!(f.device_paths, vec!["/dev/infiniband/uverbs1".to_owned()]);
        assert_eq!(
            f.existing_memlock,
            Some(Rlimit {
                soft: 65536,
                hard: 65536
            })
        );
    }
}

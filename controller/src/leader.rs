//! Leader election on a `coordination.k8s.io/v1` Lease, so the controller
//! can run with more than one replica and only one reconciles.
//!
//! The rules, as client-go's elector has them: a candidate takes the lease
//! when it is free (no holder) or expired, the holder renews it every retry
//! period, and every write carries the `resourceVersion` it read, so of two
//! candidates racing for one lease exactly one write lands (the other gets
//! 409 Conflict and follows). Expiry is judged on this candidate's own clock:
//! a lease is expired when its record has not changed for
//! `leaseDurationSeconds` since this candidate first saw it, so skew between
//! node clocks cannot make two leaders.
//!
//! [`decide`] is the pure decision; [`LeaderElector`] does one round of
//! read-decide-write against the API; [`lead`] runs the work while leading,
//! stops it (and exits with an error, so the pod restarts clean) when the
//! lease is lost, and hands the lease back on a clean shutdown.

use super::MANAGER;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kroce_operator::names::MANAGED_BY_LABEL;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

/// Timings, as client-go names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTimings {
    /// How long a lease lives without renewal (`leaseDurationSeconds`).
    pub lease_duration: Duration,
    /// The leader gives up (and exits) when it could not renew for this long.
    pub renew_deadline: Duration,
    /// Time between rounds (renewals, or attempts to acquire).
    pub retry_period: Duration,
}

impl LeaseTimings {
    /// client-go's ratios (15s / 10s / 2s) for any lease duration.
    pub fn for_duration(lease_duration: Duration) -> Self {
        let d = lease_duration.max(Duration::from_secs(3));
        LeaseTimings {
            lease_duration: d,
            renew_deadline: d * 2 / 3,
            retry_period: (d * 2 / 15).max(Duration::from_secs(1)),
        }
    }
}

/// The fields of a Lease that decide who leads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    pub holder: Option<String>,
    pub lease_duration: Option<Duration>,
    pub acquire_time: Option<Timestamp>,
    pub renew_time: Option<Timestamp>,
    pub transitions: i32,
}

impl LeaseRecord {
    fn from_lease(l: &Lease) -> Self {
        let s = l.spec.clone().unwrap_or_default();
        LeaseRecord {
            holder: s.holder_identity.filter(|h| !h.is_empty()),
            lease_duration: s
                .lease_duration_seconds
                .filter(|d| *d > 0)
                .map(|d| Duration::from_secs(d.unsigned_abs().into())),
            acquire_time: s.acquire_time.map(|t| t.0),
            renew_time: s.renew_time.map(|t| t.0),
            transitions: s.lease_transitions.unwrap_or(0),
        }
    }
}

/// What to do with the lease this round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No Lease object yet: create it naming us.
    Create,
    /// Free or expired: take it over, counting one more transition when it
    /// changes hands.
    Acquire { transitions: i32 },
    /// Ours: renew it.
    Renew,
    /// Someone else's and alive: wait.
    Follow {
        holder: String,
        expires_in: Duration,
    },
}

/// The pure decision. `observed_since` is when this candidate first saw
/// the record unchanged (its own clock); `default_duration` stands in for a
/// record without a duration.
pub fn decide(
    lease: Option<&LeaseRecord>,
    observed_since: Timestamp,
    now: Timestamp,
    identity: &str,
    default_duration: Duration,
) -> Decision {
    let Some(l) = lease else {
        return Decision::Create;
    };
    let Some(holder) = l.holder.as_deref() else {
        return Decision::Acquire {
            transitions: l.transitions + 1,
        };
    };
    if holder == identity {
        return Decision::Renew;
    }
    let duration = l.lease_duration.unwrap_or(default_duration);
    let age = now.duration_since(observed_since);
    let live = SignedDuration::try_from(duration).unwrap_or(SignedDuration::MAX);
    if age >= live {
        Decision::Acquire {
            transitions: l.transitions + 1,
        }
    } else {
        Decision::Follow {
            holder: holder.to_string(),
            expires_in: Duration::try_from(live - age).unwrap_or_default(),
        }
    }
}

/// Who leads after a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Leader,
    /// `holder` is `None` when a write race was lost and the winner is not
    /// known yet.
    Follower {
        holder: Option<String>,
    },
}

/// One candidate for one lease.
#[derive(Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    namespace: String,
    identity: String,
    pub timings: LeaseTimings,
    /// `(resourceVersion, first seen)` of the record last read.
    observed: Option<(String, Timestamp)>,
}

fn micro(t: Timestamp) -> Option<MicroTime> {
    Some(MicroTime(t))
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl LeaderElector {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timings: LeaseTimings,
    ) -> Self {
        LeaderElector {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            namespace: namespace.to_string(),
            identity: identity.to_string(),
            timings,
            observed: None,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// `namespace/name` of the lease, for messages.
    pub fn lease_ref(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.timings.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    fn lease(&self, spec: LeaseSpec, resource_version: Option<String>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                resource_version,
                labels: Some(BTreeMap::from([(
                    MANAGED_BY_LABEL.to_string(),
                    MANAGER.to_string(),
                )])),
                ..Default::default()
            },
            spec: Some(spec),
        }
    }

    /// Reads the lease and remembers when its record first looked like this.
    pub async fn observe(&mut self, now: Timestamp) -> Result<Option<Lease>, kube::Error> {
        let lease = self.api.get_opt(&self.name).await?;
        let rv = lease
            .as_ref()
            .and_then(|l| l.metadata.resource_version.clone())
            .unwrap_or_default();
        match &self.observed {
            Some((seen, _)) if *seen == rv => {}
            _ => self.observed = Some((rv, now)),
        }
        Ok(lease)
    }

    /// Decides on `lease` (as [`observe`](Self::observe) returned it) and
    /// writes; a write that loses a race (409) makes this a follower.
    pub async fn act(&mut self, lease: Option<Lease>, now: Timestamp) -> Result<Role, kube::Error> {
        let record = lease.as_ref().map(LeaseRecord::from_lease);
        let since = self.observed.as_ref().map_or(now, |(_, t)| *t);
        let decision = decide(
            record.as_ref(),
            since,
            now,
            &self.identity,
            self.timings.lease_duration,
        );
        let rv = lease
            .as_ref()
            .and_then(|l| l.metadata.resource_version.clone());
        let written = match decision {
            Decision::Follow { holder, .. } => {
                return Ok(Role::Follower {
                    holder: Some(holder),
                });
            }
            Decision::Create => {
                let l = self.lease(
                    LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(self.duration_seconds()),
                        acquire_time: micro(now),
                        renew_time: micro(now),
                        lease_transitions: Some(0),
                        ..Default::default()
                    },
                    None,
                );
                self.api.create(&PostParams::default(), &l).await
            }
            Decision::Acquire { transitions } => {
                let l = self.lease(
                    LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(self.duration_seconds()),
                        acquire_time: micro(now),
                        renew_time: micro(now),
                        lease_transitions: Some(transitions),
                        ..Default::default()
                    },
                    rv,
                );
                self.api
                    .replace(&self.name, &PostParams::default(), &l)
                    .await
            }
            Decision::Renew => {
                let mut spec = lease.and_then(|l| l.spec).unwrap_or_default();
                spec.renew_time = micro(now);
                spec.lease_duration_seconds = Some(self.duration_seconds());
                let l = self.lease(spec, rv);
                self.api
                    .replace(&self.name, &PostParams::default(), &l)
                    .await
            }
        };
        match written {
            Ok(l) => {
                // Our own write is a record we have seen from now on.
                let rv = l.metadata.resource_version.unwrap_or_default();
                self.observed = Some((rv, now));
                Ok(Role::Leader)
            }
            Err(e) if is_conflict(&e) => Ok(Role::Follower { holder: None }),
            Err(e) => Err(e),
        }
    }

    /// One round: read, decide, write.
    pub async fn try_acquire_or_renew(&mut self, now: Timestamp) -> Result<Role, kube::Error> {
        let lease = self.observe(now).await?;
        self.act(lease, now).await
    }

    /// Hands the lease back (holder cleared) if we still hold it, so another
    /// replica takes over at once instead of after the lease expires.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let record = LeaseRecord::from_lease(&lease);
        if record.holder.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        let mut spec = lease.spec.unwrap_or_default();
        spec.holder_identity = None;
        let l = self.lease(spec, lease.metadata.resource_version);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &l)
            .await
        {
            Ok(_) => Ok(()),
            // Someone else wrote it meanwhile: it is not ours to release.
            Err(e) if is_conflict(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Why the leader stopped leading.
#[derive(Debug, thiserror::Error)]
pub enum LeadershipLost {
    #[error("lease {lease} now held by {holder}: stopping")]
    TakenOver { lease: String, holder: String },
    #[error("could not renew lease {lease} for {deadline:?} (last error: {error}): stopping")]
    RenewFailed {
        lease: String,
        deadline: Duration,
        error: String,
    },
}

/// Renews every retry period until the lease is lost. Each attempt gets
/// only the time left before the renew deadline (measured on tokio's clock
/// from the last successful renewal): a request that hangs must not let
/// this replica go on reconciling after the lease has expired and another
/// replica took over (the deadline is shorter than the lease).
async fn keep_renewing(elector: &mut LeaderElector) -> LeadershipLost {
    let mut last_renew = tokio::time::Instant::now();
    let mut last_error = String::new();
    loop {
        tokio::time::sleep(elector.timings.retry_period).await;
        let deadline = last_renew + elector.timings.renew_deadline;
        let attempt =
            tokio::time::timeout_at(deadline, elector.try_acquire_or_renew(Timestamp::now()));
        match attempt.await {
            Ok(Ok(Role::Leader)) => last_renew = tokio::time::Instant::now(),
            Ok(Ok(Role::Follower {
                holder: Some(holder),
            })) => {
                return LeadershipLost::TakenOver {
                    lease: elector.lease_ref(),
                    holder,
                };
            }
            // Lost a write race: re-read next round, within the deadline.
            Ok(Ok(Role::Follower { holder: None })) => last_error = "write conflict".into(),
            Ok(Err(e)) => last_error = e.to_string(),
            Err(_) => last_error = "the renewal got no answer before the deadline".into(),
        }
        if tokio::time::Instant::now() >= last_renew + elector.timings.renew_deadline {
            return LeadershipLost::RenewFailed {
                lease: elector.lease_ref(),
                deadline: elector.timings.renew_deadline,
                error: last_error,
            };
        }
    }
}

/// Waits to lead (returns `Ok(None)` when `stop` fires first), then runs
/// `work` while leading. Losing the lease drops `work` (reconciling stops)
/// and returns the error ([`LeadershipLost`], naming the lease, in `work`'s
/// error type); `work` ending (SIGTERM) hands the lease back.
pub async fn lead<W, S, E>(
    elector: &mut LeaderElector,
    work: impl FnOnce() -> W,
    stop: S,
) -> Result<Option<()>, E>
where
    W: Future<Output = Result<(), E>>,
    S: Future<Output = ()>,
    E: From<LeadershipLost>,
{
    tokio::pin!(stop);
    let mut last_holder: Option<String> = None;
    loop {
        match elector.try_acquire_or_renew(Timestamp::now()).await {
            Ok(Role::Leader) => break,
            Ok(Role::Follower { holder }) => {
                if holder.is_some() && holder != last_holder {
                    tracing::info!(lease = %elector.lease_ref(), holder = ?holder, "waiting for the lease");
                    last_holder = holder;
                }
            }
            Err(e) => {
                tracing::warn!(lease = %elector.lease_ref(), error = %e, "cannot read or write the lease")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(elector.timings.retry_period) => {}
            _ = &mut stop => return Ok(None),
        }
    }
    tracing::info!(lease = %elector.lease_ref(), identity = %elector.identity(), "leading");
    let outcome = {
        let renew = keep_renewing(elector);
        tokio::pin!(renew);
        tokio::select! {
            r = work() => Ok(r),
            lost = &mut renew => Err(lost),
        }
    };
    match outcome {
        Ok(r) => {
            if let Err(e) = elector.release().await {
                tracing::warn!(lease = %elector.lease_ref(), error = %e, "cannot release the lease");
            }
            r.map(Some)
        }
        Err(lost) => Err(lost.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kroce_operator::testing::mock::ApiServer;

    const S15: Duration = Duration::from_secs(15);

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn held_by(h: &str) -> LeaseRecord {
        LeaseRecord {
            holder: Some(h.into()),
            lease_duration: Some(S15),
            renew_time: Some(t(0)),
            transitions: 2,
            ..Default::default()
        }
    }

    #[test]
    fn decision_table() {
        assert_eq!(decide(None, t(0), t(0), "a", S15), Decision::Create);
        let free = LeaseRecord {
            holder: None,
            transitions: 4,
            ..Default::default()
        };
        assert_eq!(
            decide(Some(&free), t(0), t(0), "a", S15),
            Decision::Acquire { transitions: 5 }
        );
        assert_eq!(
            decide(Some(&held_by("a")), t(0), t(100), "a", S15),
            Decision::Renew,
            "our own lease is renewed even when late"
        );
        assert_eq!(
            decide(Some(&held_by("b")), t(0), t(5), "a", S15),
            Decision::Follow {
                holder: "b".into(),
                expires_in: Duration::from_secs(10)
            }
        );
        assert_eq!(
            decide(Some(&held_by("b")), t(0), t(15), "a", S15),
            Decision::Acquire { transitions: 3 },
            "expired after leaseDurationSeconds unchanged"
        );
    }

    #[test]
    fn expiry_is_measured_on_the_local_clock_not_the_record() {
        // The holder's clock runs an hour behind: its renewTime looks ancient,
        // but we saw the record change just now, so it is alive.
        let mut skewed = held_by("b");
        skewed.renew_time = Some(t(-3600));
        assert!(matches!(
            decide(Some(&skewed), t(0), t(1), "a", S15),
            Decision::Follow { .. }
        ));
        // The record's own duration wins over ours.
        let mut short = held_by("b");
        short.lease_duration = Some(Duration::from_secs(2));
        assert!(matches!(
            decide(Some(&short), t(0), t(2), "a", S15),
            Decision::Acquire { .. }
        ));
    }

    #[test]
    fn timings_follow_client_go_ratios() {
        let t = LeaseTimings::for_duration(S15);
        assert_eq!(t.renew_deadline, Duration::from_secs(10));
        assert_eq!(t.retry_period, Duration::from_secs(2));
        let tiny = LeaseTimings::for_duration(Duration::from_secs(1));
        assert_eq!(tiny.lease_duration, Duration::from_secs(3));
        assert_eq!(tiny.retry_period, Duration::from_secs(1));
    }

    fn elector(client: &Client, id: &str) -> LeaderElector {
        LeaderElector::new(
            client.clone(),
            "kroce-system",
            "kroce-operator",
            id,
            LeaseTimings::for_duration(S15),
        )
    }

    fn holder(server: &ApiServer) -> Option<String> {
        server
            .get(
                "/apis/coordination.k8s.io/v1",
                "leases",
                "kroce-system",
                "kroce-operator",
            )
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
    }

    #[tokio::test]
    async fn two_candidates_one_wins_and_expiry_hands_over() {
        let (client, server) = ApiServer::start();
        let mut a = elector(&client, "pod-a");
        let mut b = elector(&client, "pod-b");
        assert_eq!(a.try_acquire_or_renew(t(0)).await.unwrap(), Role::Leader);
        assert_eq!(
            b.try_acquire_or_renew(t(1)).await.unwrap(),
            Role::Follower {
                holder: Some("pod-a".into())
            }
        );
        // a renews: b keeps following even well past the first lease's end.
        assert_eq!(a.try_acquire_or_renew(t(10)).await.unwrap(), Role::Leader);
        assert!(matches!(
            b.try_acquire_or_renew(t(20)).await.unwrap(),
            Role::Follower { .. }
        ));
        assert_eq!(holder(&server).as_deref(), Some("pod-a"));
        // a stops renewing (hung, partitioned): 15s after b last saw a change, b takes over.
        assert!(matches!(
            b.try_acquire_or_renew(t(34)).await.unwrap(),
            Role::Follower { .. }
        ));
        assert_eq!(b.try_acquire_or_renew(t(35)).await.unwrap(), Role::Leader);
        assert_eq!(holder(&server).as_deref(), Some("pod-b"));
        let lease = server
            .get(
                "/apis/coordination.k8s.io/v1",
                "leases",
                "kroce-system",
                "kroce-operator",
            )
            .unwrap();
        assert_eq!(lease["spec"]["leaseTransitions"], 1);
        assert_eq!(lease["spec"]["leaseDurationSeconds"], 15);
        // a wakes up and learns it lost.
        assert_eq!(
            a.try_acquire_or_renew(t(36)).await.unwrap(),
            Role::Follower {
                holder: Some("pod-b".into())
            }
        );
    }

    #[tokio::test]
    async fn of_two_racing_writes_exactly_one_lands() {
        let (client, server) = ApiServer::start();
        let mut a = elector(&client, "pod-a");
        let mut b = elector(&client, "pod-b");
        // Both see no lease, both create: one 409s.
        let seen_a = a.observe(t(0)).await.unwrap();
        let seen_b = b.observe(t(0)).await.unwrap();
        assert_eq!(a.act(seen_a, t(0)).await.unwrap(), Role::Leader);
        assert_eq!(
            b.act(seen_b, t(0)).await.unwrap(),
            Role::Follower { holder: None }
        );
        // The lease expires for both; both read the same resourceVersion and
        // try to take it: the second write carries a stale version.
        let mut c = elector(&client, "pod-c");
        c.observe(t(0)).await.unwrap();
        b.observe(t(0)).await.unwrap();
        let seen_b = b.observe(t(20)).await.unwrap();
        let seen_c = c.observe(t(20)).await.unwrap();
        assert_eq!(b.act(seen_b, t(20)).await.unwrap(), Role::Leader);
        assert_eq!(
            c.act(seen_c, t(20)).await.unwrap(),
            Role::Follower { holder: None }
        );
        assert_eq!(holder(&server).as_deref(), Some("pod-b"));
    }

    #[tokio::test]
    async fn release_frees_the_lease_for_an_immediate_takeover() {
        let (client, server) = ApiServer::start();
        let mut a = elector(&client, "pod-a");
        let mut b = elector(&client, "pod-b");
        a.try_acquire_or_renew(t(0)).await.unwrap();
        // b cannot release what it does not hold.
        b.release().await.unwrap();
        assert_eq!(holder(&server).as_deref(), Some("pod-a"));
        a.release().await.unwrap();
        assert_eq!(holder(&server), None);
        assert_eq!(b.try_acquire_or_renew(t(1)).await.unwrap(), Role::Leader);
    }

    #[tokio::test]
    async fn lead_runs_the_work_and_releases_and_stops_waiting_on_signal() {
        let (client, server) = ApiServer::start();
        let mut a = elector(&client, "pod-a");
        let ran = lead(
            &mut a,
            || async { Ok::<(), LeadershipLost>(()) },
            std::future::pending(),
        )
        .await
        .unwrap();
        assert_eq!(ran, Some(()));
        assert_eq!(holder(&server), None, "released after the work ended");
        // b holds it now; a waits until told to stop, never running the work.
        let mut b = elector(&client, "pod-b");
        b.try_acquire_or_renew(Timestamp::now()).await.unwrap();
        let mut a = elector(&client, "pod-a");
        let ran = lead(
            &mut a,
            || async { anyhow::bail!("must not run while b leads") },
            async {},
        )
        .await
        .unwrap();
        assert_eq!(ran, None);
    }

    #[tokio::test]
    async fn losing_the_lease_stops_the_work_with_an_error() {
        let (client, server) = ApiServer::start();
        let mut a = LeaderElector::new(
            client.clone(),
            "kroce-system",
            "kroce-operator",
            "pod-a",
            LeaseTimings {
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_millis(20),
            },
        );
        let s = server.clone();
        let work = || async move {
            // Another replica takes the lease while we work.
            tokio::time::sleep(Duration::from_millis(50)).await;
            s.edit(
                "/apis/coordination.k8s.io/v1",
                "leases",
                "kroce-system",
                "kroce-operator",
                |l| {
                    l["spec"]["holderIdentity"] = "pod-z".into();
                    l["metadata"]["resourceVersion"] = "999".into();
                },
            );
            std::future::pending::<()>().await;
            Ok::<(), LeadershipLost>(())
        };
        let err = lead(&mut a, work, std::future::pending())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("pod-z"), "{err}");
    }

    /// A renewal that hangs (the API server or the network stops answering)
    /// ends leadership at the renew deadline, before the lease can expire
    /// and another replica take over: the work is dropped by then.
    #[tokio::test(start_paused = true)]
    async fn a_hung_renewal_stops_the_leader_at_the_renew_deadline() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        struct Running(Arc<AtomicBool>);
        impl Drop for Running {
            fn drop(&mut self) {
                self.0.store(false, Ordering::SeqCst);
            }
        }
        let (client, server) = ApiServer::start();
        let mut a = elector(&client, "pod-a");
        let running = Arc::new(AtomicBool::new(false));
        let r = running.clone();
        let srv = server.clone();
        let work = move || async move {
            let _guard = Running(r.clone());
            r.store(true, Ordering::SeqCst);
            // Leading: from now on nothing about the lease gets an answer.
            for m in ["GET", "PUT", "PATCH", "POST"] {
                srv.hang_on(m, "/leases");
            }
            std::future::pending::<anyhow::Result<()>>().await
        };
        let started = tokio::time::Instant::now();
        let out = tokio::time::timeout(S15 * 4, lead(&mut a, work, std::future::pending::<()>()))
            .await
            .expect("leadership must end within the renew deadline, not hang");
        let err = out.unwrap_err().to_string();
        assert!(err.contains("could not renew"), "{err}");
        let took = started.elapsed();
        let timings = LeaseTimings::for_duration(S15);
        assert!(
            took <= timings.renew_deadline + timings.retry_period && took < S15,
            "stopped after {took:?}; the lease lives {S15:?}"
        );
        assert!(!running.load(Ordering::SeqCst), "the work still runs");
    }
}

//! Several instances on one PostgreSQL: the shards held under leases, the marks of each
//! analysed by its holder, and each client's spans routed to whoever holds its shard.

use super::*;

/// The live analyzer on a database several instances share: a lease keeper renews and
/// balances this instance's shards while the analyzer works through their marks.
pub(super) async fn run_coordinated(
    store: Arc<dyn Store>,
    dirty: Arc<DirtyClients>,
    metrics: Arc<SelfMetrics>,
    config: Config,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let Some(coordinator) = store.coordinator() else { return Ok(()) };
    let instance = config.cluster.instance_id();
    let lease = Duration::from_secs(config.cluster.lease_seconds);
    tracing::info!(%instance, lease_seconds = config.cluster.lease_seconds, "live analysis shared through database leases");
    let (leases_tx, leases_rx) = watch::channel(HeldShards::default());
    let keeper = keep_leases(coordinator, &instance, lease, &metrics, leases_tx, shutdown.clone());
    let analyzer = analyze_marks(store.as_ref(), coordinator, &dirty, &metrics, &config, leases_rx, shutdown);
    let ((), ()) = tokio::join!(keeper, analyzer);
    // A clean stop hands the shards over now rather than when the leases run out.
    if let Err(error) = coordinator.release(&instance).await {
        tracing::warn!(%error, %instance, "could not release the analysis leases; they expire on their own");
    }
    Ok(())
}

/// The shards this instance holds, as the lease keeper last published them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct HeldShards {
    /// Ascending.
    shards: Vec<i32>,
    /// Balancing rounds so far that took shards: the marks of a shard taken may have been
    /// analysed elsewhere since this instance last held it (so what it kept of them is stale).
    claims: u64,
}

/// Balances every third of the lease and publishes the shards held. A round that fails keeps
/// the shards known to be held until their leases would have run out.
pub(super) async fn keep_leases(
    coordinator: &dyn Coordinator,
    instance: &str,
    lease: Duration,
    metrics: &SelfMetrics,
    leases_tx: watch::Sender<HeldShards>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut held_until = Instant::now();
    let mut claims = 0;
    loop {
        let round_started = Instant::now();
        match coordinator.balance(instance, lease).await {
            Ok(leases) => {
                if !leases.claimed.is_empty() || !leases.released.is_empty() {
                    tracing::info!(
                        %instance,
                        claimed = ?leases.claimed,
                        released = ?leases.released,
                        held = leases.shards.len(),
                        live_instances = leases.live_instances,
                        "analysis shards moved"
                    );
                }
                metrics.cluster_shards_claimed.add(leases.claimed.len() as u64);
                metrics.cluster_shards_held.set(leases.shards.len() as u64);
                metrics.cluster_live_instances.set(u64::from(leases.live_instances));
                held_until = round_started + lease;
                claims += u64::from(!leases.claimed.is_empty());
                leases_tx.send_replace(HeldShards { shards: leases.shards, claims });
            }
            Err(error) => {
                metrics.cluster_lease_failures.add(1);
                tracing::error!(%error, %instance, "lease balancing round failed");
                if Instant::now() >= held_until {
                    metrics.cluster_shards_held.set(0);
                    leases_tx.send_replace(HeldShards { shards: Vec::new(), claims });
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(lease / 3) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

/// Takes the marks of the shards held, oldest first, and analyses them; removes each mark
/// once analysed (unless it was marked again meanwhile). Wakes on this instance's commits,
/// and every poll interval for the others'.
pub(super) async fn analyze_marks(
    store: &dyn Store,
    coordinator: &dyn Coordinator,
    dirty: &DirtyClients,
    metrics: &SelfMetrics,
    config: &Config,
    mut leases: watch::Receiver<HeldShards>,
    mut shutdown: watch::Receiver<bool>,
) {
    let poll = Duration::from_millis(config.cluster.poll_interval_ms);
    // Scope marks carry the oldest time of the samples committed to the scope: scopes'
    // samples are held, with the care `hold_samples` takes.
    let mut kept = Kept::new(config, config.live.scope_cache_samples, metrics);
    let mut claims = 0;
    let mut recorder = Recorder::default();
    loop {
        let held = leases.borrow_and_update().clone();
        let shards = held.shards;
        // Batches committed here before the marks are read: analysed once the marks are.
        let marked = metrics.batches_marked.get();
        let started = Instant::now();
        // Whether a pass ran, and whether it took every mark waiting.
        let outcome = async {
            let marks = coordinator.pending_marks(&shards, MARKS_PER_PASS).await?;
            if marks.is_empty() {
                return Ok((false, true));
            }
            let claimed = std::mem::replace(&mut claims, held.claims) != held.claims;
            if claimed {
                // Lines committed while another instance held a cluster's mark were read there.
                kept.lines.current.clear();
            }
            hold_samples(&mut kept.samples, &shards, claimed, marks.len() < MARKS_PER_PASS as usize);
            let held: HashSet<i32> = shards.iter().copied().collect();
            let pass = resolve_marks(store, coordinator, &held, &marks).await?;
            let findings = analysis_pass(store, metrics, config, &mut kept, pass, Some(&held)).await?;
            recorder.store(store, metrics, findings).await?;
            recorder.found.log_every(NEW_ANOMALIES_LOG_INTERVAL);
            coordinator.finish_marks(&marks).await?;
            Ok::<_, lagscope_store::StoreError>((true, marks.len() < MARKS_PER_PASS as usize))
        }
        .await;
        if let Ok((true, _)) = outcome {
            metrics.analysis_passes.add(1);
            metrics.analysis_latency.observe(started.elapsed());
        }
        match outcome {
            // Nothing more waiting: sleep until woken.
            Ok((_, true)) => {
                // (Once shards are held: batches whose marks fall in shards held elsewhere are
                // those instances' to analyse; /api/v1/cluster counts what waits anywhere.)
                if !shards.is_empty() {
                    metrics.batches_analyzed.raise_to(marked);
                }
                recorder.found.log_every(NEW_ANOMALIES_LOG_INTERVAL);
                tokio::select! {
                    _ = dirty.take() => {}
                    _ = leases.changed() => {}
                    () = tokio::time::sleep(poll) => {}
                    _ = shutdown.wait_for(|stop| *stop) => return,
                }
                continue;
            }
            Ok((_, false)) => {}
            Err(error) => {
                metrics.analysis_errors.add(1);
                tracing::error!(%error, "live analysis pass failed; its marks stay for the next one");
                tokio::select! {
                    () = tokio::time::sleep(RETRY_AFTER_FAILURE) => {}
                    _ = shutdown.wait_for(|stop| *stop) => return,
                }
                continue;
            }
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

/// Which scopes' samples the sample cache may hold for a pass (on a database several instances
/// share), so that what it holds plus what the pass's marks say was committed since is what
/// the store holds, as on SQLite, where the marks are this process's own:
/// - nothing held survives a round that took shards (`claimed`): their marks may have been
///   analysed, and removed, by another instance meanwhile;
/// - nor a pass that leaves marks of its shards waiting (it took as many as a pass takes, not
///   `every_mark_taken`): what they stand for is already visible to the pass's reads, but
///   their sample times are not known yet;
/// - a scope is held only while this instance holds the shards of its own mark and of its
///   cluster's samples of no namespace (read with it, marked under `(cluster, None)`); and not
///   without a cluster, whose samples mark no scope.
pub(crate) fn hold_samples(cache: &mut SampleCache, shards: &[i32], claimed: bool, every_mark_taken: bool) {
    if claimed || !every_mark_taken {
        cache.clear();
    }
    let held: HashSet<i32> = shards.iter().copied().collect();
    cache.hold_only(Box::new(move |(cluster, namespace): &ScopeKey| {
        cluster.is_some()
            && held.contains(&Mark::Scope(cluster.clone(), namespace.clone()).shard())
            && held.contains(&Mark::Scope(cluster.clone(), None).shard())
    }));
}

/// What a set of marks asks for, as one pass: the clients of marked traces (their spans are
/// committed now) join the pass when their shard is held here and are marked for their own
/// shard's holder otherwise.
pub(crate) async fn resolve_marks(
    store: &dyn Store,
    coordinator: &dyn Coordinator,
    held: &HashSet<i32>,
    marks: &[lagscope_store::PendingMark],
) -> Result<Pending, lagscope_store::StoreError> {
    let mut pass = Pending::default();
    let mut traces = Vec::new();
    for pending in marks {
        match &pending.mark {
            Mark::Client(client_id) => {
                pass.clients.insert(client_id.clone());
            }
            Mark::Trace(trace_id) => traces.push(trace_id.clone()),
            Mark::Scope(cluster, namespace) => {
                let scope = (cluster.clone(), namespace.clone());
                if let Some(time) = pending.samples_from {
                    let oldest = pass.sample_times.entry(scope.clone()).or_insert(time);
                    *oldest = (*oldest).min(time);
                }
                pass.scopes.insert(scope);
            }
            Mark::LogCluster(cluster) => {
                pass.log_clusters.insert(cluster.clone());
            }
        }
    }
    let clients = store.clients_of_traces(&traces).await?;
    route_clients(coordinator, held, clients, &mut pass.clients).await?;
    Ok(pass)
}

/// Clients to analyse again: those whose shard is `held` here join `pass`, the others are
/// marked for their shards' holders.
pub(super) async fn route_clients(
    coordinator: &dyn Coordinator,
    held: &HashSet<i32>,
    clients: impl IntoIterator<Item = String>,
    pass: &mut BTreeSet<String>,
) -> Result<(), lagscope_store::StoreError> {
    let mut elsewhere = Vec::new();
    for client_id in clients {
        let mark = Mark::Client(client_id);
        if held.contains(&mark.shard()) {
            if let Mark::Client(client_id) = mark {
                pass.insert(client_id);
            }
        } else {
            elsewhere.push(mark);
        }
    }
    if !elsewhere.is_empty() {
        coordinator.add_marks(&elsewhere).await?;
    }
    Ok(())
}

//! Recognised log lines a pass reads, and whose they are: a line that names no client is the
//! one client's that calls cluster URLs from its process (across instances: `ProcessOwners`).

use super::*;

/// The recognised log lines of each cluster, as last read from the store: every pass sees
/// them, not only the passes of batches that brought new lines (a window's evidence would
/// otherwise change with which batch came last). Re-read when a cluster's lines arrive; as
/// the store's read, at most `max_logs_per_cluster` lines of the scope window per cluster.
#[derive(Default)]
pub(super) struct RecognisedLines {
    /// Shared (not copied) with every pass that reads them.
    pub(super) by_cluster: BTreeMap<Option<String>, Vec<Arc<LogEvent>>>,
    /// The lines that name a client (a Pulsar client's switches, an Ozone client's disabling
    /// of follower reads), by client: what each client pass reads.
    by_client: HashMap<String, Vec<Arc<LogEvent>>>,
    /// Switch lines that name no client, by the process (cluster, node) that logged them: a
    /// client pass reads those of the processes it is the one client of ([`AddressCallers`]).
    pub(super) unnamed_switches: HashMap<Process, Vec<Arc<LogEvent>>>,
    /// What the store fed (SQLite): each cluster's lines, read and classified once.
    held: LineCache,
    /// Several instances sharing the database: the clusters whose lines were read since this
    /// instance last claimed shards, while it held their marks' shards. It reads every new line
    /// of those (their marks are its own) and need not look again until it claims shards.
    pub(super) current: HashSet<Option<String>>,
}

/// What a pass reads of a cluster's recognised lines: the scope window (nanoseconds) and the
/// newest `live.max_logs_per_cluster` of it.
pub(super) fn lines_window(config: &Config) -> (i64, u32) {
    (config.live.scope_window_seconds * 1_000_000_000, config.live.max_logs_per_cluster)
}

impl RecognisedLines {
    /// A scope's lines: its namespace's, and every evidence line of its cluster (matched to
    /// anomalies by node and shard when attached).
    pub(super) fn of_scope(&self, (cluster, namespace): &ScopeKey) -> Vec<Arc<LogEvent>> {
        let Some(events) = self.by_cluster.get(cluster) else { return Vec::new() };
        (events.iter())
            .filter(|event| event.namespace == *namespace || event.kind.is_evidence())
            .map(Arc::clone)
            .collect()
    }

    /// Reads the recognised lines of the scope window of each of `clusters` (as the store's
    /// read, at most `max_logs_per_cluster` each), replacing what was held of them. On a feed
    /// they are held between passes: one read brings every cluster's lines committed since
    /// ([`LineCache::refresh`]). Whether any cluster's lines changed.
    pub(super) async fn refresh(
        &mut self,
        store: &dyn Store,
        clusters: &[Option<String>],
        config: &Config,
        kept_from: Option<UnixNanos>,
    ) -> Result<bool, lagscope_store::StoreError> {
        let (window, limit) = lines_window(config);
        if let Some(feed) = store.span_feed() {
            let changed = self.held.refresh(feed, clusters, (window, limit), kept_from).await?;
            let any = !changed.is_empty();
            self.by_cluster.extend(changed);
            return Ok(any);
        }
        for cluster in clusters {
            // Only candidate lines (an index finds them) leave the store; classify decides.
            let logs = store.recognised_logs(cluster.as_deref(), window, limit).await?;
            let mut events: Vec<Arc<LogEvent>> = logs.iter().filter_map(classify).map(Arc::new).collect();
            // A line stored twice is one line: the store keeps a record sent again once, but
            // not one line forwarded by two shippers (observed twice).
            take_once(&mut events);
            self.by_cluster.insert(cluster.clone(), events);
        }
        Ok(!clusters.is_empty())
    }

    /// Several instances: brings the lines of `clusters` up to date (on a feed, those committed
    /// since this instance last read them, all in one read), but for the clusters this pass
    /// read already (`read_now`) and those whose mark this instance holds (`holds`) and has read
    /// since it last claimed shards.
    pub(super) async fn refresh_stale(
        &mut self,
        store: &dyn Store,
        clusters: BTreeSet<&Option<String>>,
        read_now: &BTreeSet<Option<String>>,
        holds: impl Fn(&Option<String>) -> bool,
        config: &Config,
        kept_from: Option<UnixNanos>,
    ) -> Result<(), lagscope_store::StoreError> {
        let stale: Vec<Option<String>> = (clusters.into_iter())
            .filter(|cluster| !read_now.contains(*cluster))
            .filter(|cluster| !(holds(cluster) && self.current.contains(*cluster)))
            .cloned()
            .collect();
        if self.refresh(store, &stale, config, kept_from).await? {
            self.index_clients();
        }
        self.current.extend(stale.into_iter().filter(|cluster| holds(cluster)));
        Ok(())
    }

    pub(super) fn index_clients(&mut self) {
        self.by_client.clear();
        self.unnamed_switches.clear();
        for event in self.by_cluster.values().flatten() {
            if let Some(client) = &event.client_id {
                self.by_client.entry(client.clone()).or_default().push(Arc::clone(event));
            } else if event.kind == LogEventKind::ClusterSwitch
                && let Some(node) = &event.node_id
            {
                let process = (event.cluster.clone(), node.clone());
                self.unnamed_switches.entry(process).or_default().push(Arc::clone(event));
            }
        }
    }

    /// A client's lines: those that name it, and the unnamed switch lines of the processes it
    /// is the one client of, by `owned` ([`RecognisedLines::unnamed_by_owner`]), in time order.
    pub(super) fn of_client(&self, client: &str, owned: &HashMap<&str, Vec<&Arc<LogEvent>>>) -> Vec<Arc<LogEvent>> {
        let mut events = self.by_client.get(client).cloned().unwrap_or_default();
        if let Some(unnamed) = owned.get(client) {
            events.extend(unnamed.iter().map(|event| Arc::clone(event)));
            events.sort_by_key(|event| event.time_unix_nano);
        }
        events
    }

    /// The unnamed switch lines, by the one client of the process that logged them (every
    /// process with such lines found in `owners`).
    pub(super) fn unnamed_by_owner<'a>(
        &'a self,
        owners: &'a ProcessOwners,
    ) -> HashMap<&'a str, Vec<&'a Arc<LogEvent>>> {
        let mut owned: HashMap<&str, Vec<&Arc<LogEvent>>> = HashMap::new();
        for (process, events) in &self.unnamed_switches {
            if let Some(client) = owners.owner(process) {
                owned.entry(client).or_default().extend(events);
            }
        }
        owned
    }
}

/// A process: the cluster and node of its resource.
pub(super) type Process = (Option<String>, String);

/// The clients that called cluster URLs (`server.address`) from each process, as this
/// instance's client passes saw them: the switch lines a process logs without naming a client
/// are the switches of its one such client (`failover_flapping`), and of no one where there
/// are several. A client not seen for a scope window is forgotten. With several instances
/// sharing a database, each sees the clients of the shards it holds: what they saw is written
/// to the database ([`Coordinator::note_process_clients`]) and the owners are read from there
/// ([`ProcessOwners`]).
#[derive(Default)]
pub(super) struct AddressCallers {
    /// Per process, its clients (at most two are kept: two is already "several"), each with
    /// when a pass last saw it.
    pub(super) processes: HashMap<Process, Vec<(String, Instant)>>,
    pruned: Option<Instant>,
    /// Several instances: when this instance last wrote each pair to the database.
    written: HashMap<(Process, String), Instant>,
}

impl AddressCallers {
    pub(super) fn note(&mut self, (cluster, node): (Option<&str>, &str), client: &str, now: Instant) {
        let process = (cluster.map(str::to_string), node.to_string());
        let clients = self.processes.entry(process).or_default();
        if let Some((_, seen)) = clients.iter_mut().find(|(known, _)| known == client) {
            *seen = now;
        } else if clients.len() < 2 {
            clients.push((client.to_string(), now));
        }
    }

    pub(super) fn owner(&self, process: &Process) -> Option<&str> {
        match self.processes.get(process).map(Vec::as_slice) {
            Some([(client, _)]) => Some(client),
            _ => None,
        }
    }

    /// Whether a pair seen at `now` is to be written to the database: it never was, or not for
    /// a quarter of `window` (the database forgets pairs not written for a window).
    pub(super) fn write_due(
        &self,
        (cluster, node): (Option<&str>, &str),
        client: &str,
        window: Duration,
        now: Instant,
    ) -> bool {
        let pair = ((cluster.map(str::to_string), node.to_string()), client.to_string());
        self.written.get(&pair).is_none_or(|written| now.duration_since(*written) >= window / 4)
    }

    /// Notes the pairs written to the database at `now`.
    pub(super) fn wrote(&mut self, pairs: Vec<(Option<String>, String, String)>, now: Instant) {
        for (cluster, node, client) in pairs {
            self.written.insert(((cluster, node), client), now);
        }
    }

    /// Forgets the clients not seen for `window` (looked at once per `window` at most);
    /// whether it looked.
    pub(super) fn prune(&mut self, window: Duration, now: Instant) -> bool {
        if self.pruned.is_some_and(|pruned| now.duration_since(pruned) < window) {
            return false;
        }
        self.pruned = Some(now);
        for clients in self.processes.values_mut() {
            clients.retain(|(_, seen)| now.duration_since(*seen) < window);
        }
        self.processes.retain(|_, clients| !clients.is_empty());
        self.written.retain(|_, written| now.duration_since(*written) < window);
        true
    }

    /// Notes the (cluster, node, client) calls a pass saw at `now` and forgets the clients not
    /// seen for `window`. With several instances (`shared`), also writes the pairs due
    /// ([`AddressCallers::write_due`]), counted as written once the write succeeded, and lets
    /// the database forget the pairs not written for a window when this one looked.
    pub(super) async fn record(
        &mut self,
        seen: Vec<(Option<String>, String, String)>,
        shared: Option<&dyn Coordinator>,
        window: Duration,
        now: Instant,
    ) -> Result<(), lagscope_store::StoreError> {
        let mut to_write = Vec::new();
        for (cluster, node, client) in seen {
            self.note((cluster.as_deref(), &node), &client, now);
            if shared.is_some() && self.write_due((cluster.as_deref(), &node), &client, window, now) {
                to_write.push((cluster, node, client));
            }
        }
        let pruned = self.prune(window, now);
        if let Some(coordinator) = shared {
            let pairs: Vec<(Option<&str>, &str, &str)> = (to_write.iter())
                .map(|(cluster, node, client)| (cluster.as_deref(), node.as_str(), client.as_str()))
                .collect();
            coordinator.note_process_clients(&pairs).await?;
            self.wrote(to_write, now);
            if pruned {
                coordinator.forget_process_clients(window).await?;
            }
        }
        Ok(())
    }
}

/// The one client of each process a pass asks about (whose its unnamed switch lines are): from
/// this instance's [`AddressCallers`] alone, or, with several instances sharing the database,
/// from what every instance wrote there (the clients of one process may be analysed by
/// different instances, each seeing only its own). Read once per process per pass.
pub(super) struct ProcessOwners<'a> {
    shared: Option<(&'a dyn Coordinator, Duration)>,
    known: HashMap<Process, Option<String>>,
}

impl<'a> ProcessOwners<'a> {
    pub(super) fn new(shared: Option<(&'a dyn Coordinator, Duration)>) -> Self {
        Self { shared, known: HashMap::new() }
    }

    /// Finds the owners of `processes` not asked about before.
    pub(super) async fn find<'p>(
        &mut self,
        processes: impl IntoIterator<Item = &'p Process>,
        callers: &AddressCallers,
    ) -> Result<(), lagscope_store::StoreError> {
        let asked: Vec<&Process> = processes.into_iter().filter(|process| !self.known.contains_key(*process)).collect();
        match self.shared {
            Some((coordinator, window)) if !asked.is_empty() => {
                let keys: Vec<(Option<&str>, &str)> =
                    asked.iter().map(|(cluster, node)| (cluster.as_deref(), node.as_str())).collect();
                let owners = coordinator.process_owners(&keys, window).await?;
                self.known.extend(asked.into_iter().cloned().zip(owners));
            }
            _ => {
                for process in asked {
                    self.known.insert(process.clone(), callers.owner(process).map(str::to_string));
                }
            }
        }
        Ok(())
    }

    /// The owner of a process found before.
    pub(super) fn owner(&self, process: &Process) -> Option<&str> {
        self.known.get(process).and_then(Option::as_deref)
    }
}

//! What a correct analyzer must find in a run of the observer-reads model: each attempt judged
//! as it completes (stale reads, regressions, dropped and untrusted states), and the windows
//! (apply lag, requeue storms) and figures once the run is over.

use super::*;

impl Model {
    /// What a correct analyzer must say about this attempt, from what the model knows.
    pub(super) fn judge(&mut self, record: &AttemptRecord<'_>, end: Nanos, response_map: Option<&States>) {
        let start_unix_nano = self.truth.start_unix_nano;
        let namespace = record.namespace;
        let client = &self.clients[record.client_index];
        let log = self.namespaces.iter().find(|candidate| candidate.name == namespace).map(|ns| &ns.log);
        let expected = |kind: &str, node: Option<&str>, detail: String| ExpectedAnomaly {
            optional: false,
            kind: kind.to_string(),
            cluster: CLUSTER.to_string(),
            namespace: Some(namespace.to_string()),
            client_id: Some(client.id.clone()),
            node_id: node.map(str::to_string),
            start_unix_nano: start_unix_nano + record.start,
            end_unix_nano: start_unix_nano + end,
            detail,
        };
        let mut found = Vec::new();
        let served = match record.served {
            Served::Ok { state, .. } => Some(state),
            Served::Refused { .. } => None,
        };
        if let (Some(carried), Some(seen)) = (record.carried, client.seen.get(namespace))
            && carried < *seen
        {
            found.push(expected(
                "carried_state_regression",
                None,
                format!("carried {carried} after the client had seen {seen}"),
            ));
        }
        if let Some(carried) = record.carried
            && record.forwarded < carried
        {
            found.push(expected(
                "router_state_dropped",
                None,
                format!("the router forwarded {} to {}, the client carried {carried}", record.forwarded, record.target),
            ));
        }
        if !record.is_write
            && let Some(served) = served
        {
            let broken = [
                (client.write_floor.get(namespace), "read_your_writes"),
                (client.read_floor.get(namespace), "monotonic_reads"),
            ]
            .into_iter()
            .find_map(|(floor, guarantee)| floor.filter(|floor| served < **floor).map(|floor| (*floor, guarantee)));
            if let Some((floor, guarantee)) = broken {
                found.push(expected(
                    "stale_read",
                    Some(record.target),
                    format!("{guarantee}: served {served} below {floor}"),
                ));
            } else if let Served::Ok { at: served_at, .. } = record.served
                && let Some(replaced_at) = log.and_then(|log| log.replaced_at(served))
            {
                // Across clients RBF promises discovery within the refresh period: data older
                // than that (a stalled observer serving a client whose carried state is old) is
                // a stale refresh. An analyzer knows a commit from the next report of it (the
                // active's committed state every second, or a span's), and hosts' clocks
                // disagree a little: within that of the bound, either answer is right.
                let staleness = served_at - replaced_at;
                if staleness > REFRESH_PERIOD - CROSS_CLIENT_RESOLUTION {
                    let mut anomaly = expected(
                        "stale_read",
                        Some(record.target),
                        format!(
                            "cross_client: served {served} {:.3} s after a newer state was committed",
                            staleness as f64 / 1e9
                        ),
                    );
                    anomaly.optional = staleness <= REFRESH_PERIOD + 2 * CROSS_CLIENT_RESOLUTION;
                    found.push(anomaly);
                }
            }
        }
        let max_committed = log.map_or(0, EditLog::last);
        let untrusted = record.carried.is_some_and(|carried| carried > max_committed + TOO_FAR_AHEAD);
        self.truth.anomalies.extend(found);
        let client = &mut self.clients[record.client_index];
        if untrusted {
            let window = client.untrusted.get_or_insert((record.start, end));
            window.1 = end;
        }
        if response_map.is_some() {
            if let Some(returned) = record.returned {
                merge_max(&mut client.seen, &States::from([(namespace, returned)]));
            }
            if record.is_write
                && let Some(returned) = record.returned
            {
                merge_max(&mut client.write_floor, &States::from([(namespace, returned)]));
            }
        }
        if !record.is_write
            && let Some(served) = served
        {
            merge_max(&mut client.read_floor, &States::from([(namespace, served)]));
        }
    }

    /// Telemetry of one attempt: client → router → server, one span each.
    /// The run's window anomalies and figures, once it is over.
    pub(super) fn finish_truth(&mut self) {
        let start_unix_nano = self.truth.start_unix_nano;
        let unix = |at: Nanos| start_unix_nano + at;
        for client in &self.clients {
            if let Some((start, end)) = client.untrusted {
                self.truth.anomalies.push(ExpectedAnomaly {
                    optional: false,
                    kind: "untrusted_state".to_string(),
                    cluster: CLUSTER.to_string(),
                    namespace: Some("ns1".to_string()),
                    client_id: Some(client.id.clone()),
                    node_id: None,
                    start_unix_nano: unix(start),
                    end_unix_nano: unix(end),
                    detail: format!("carried a state {FUTURE_STATE_JUMP} beyond the active's last written txid"),
                });
            }
        }
        for namespace in &self.namespaces {
            for observer in &namespace.observers {
                let Some((stall_start, _)) = observer.stall else { continue };
                let log = &namespace.log;
                let caught_up = observer.caught_up_at(log, self.duration).unwrap_or(self.duration);
                self.truth.anomalies.push(ExpectedAnomaly {
                    optional: false,
                    kind: "apply_lag".to_string(),
                    cluster: CLUSTER.to_string(),
                    namespace: Some(namespace.name.to_string()),
                    client_id: None,
                    node_id: Some(observer.node.clone()),
                    start_unix_nano: unix(stall_start),
                    end_unix_nano: unix(caught_up),
                    detail: "edit tailing stalled; the applied state stopped while the active kept writing".to_string(),
                });
                self.truth.figure(
                    "stalled_observer_caught_up_after_seconds",
                    (caught_up - stall_start) as f64 / SECOND as f64,
                );
                // Calls requeue while the lag is within reach; beyond it the observer refuses
                // them at once ("too far behind") and the requeues stop.
                let storm_end = (stall_start..caught_up)
                    .step_by((100 * MILLISECOND) as usize)
                    .find(|at| log.written_at(*at) - observer.applied_at(log, *at) > TOO_FAR_AHEAD)
                    .unwrap_or(caught_up);
                self.truth.figure("requeue_storm_seconds", (storm_end - stall_start) as f64 / SECOND as f64);
                // A storm is requeueing that lasts (domain: "stays high for >= 30 s"); a run cut
                // short before that shows high requeues, not a storm.
                if storm_end - stall_start < REQUEUE_STORM_MIN {
                    continue;
                }
                self.truth.anomalies.push(ExpectedAnomaly {
                    optional: false,
                    kind: "requeue_storm".to_string(),
                    cluster: CLUSTER.to_string(),
                    namespace: Some(namespace.name.to_string()),
                    client_id: None,
                    node_id: Some(observer.node.clone()),
                    start_unix_nano: unix(stall_start),
                    end_unix_nano: unix(storm_end),
                    detail: "calls requeued waiting for a stalled tailer until it fell too far behind".to_string(),
                });
            }
        }
        let requeues: BTreeMap<&str, u64> =
            self.servers.iter_mut().map(|(node, server)| (*node, server.counters.read_at(Nanos::MAX).0)).collect();
        self.truth.figure("requeues_per_server", serde_json::json!(requeues));
        self.truth.figure("spans", self.emitter.spans_emitted);
    }
}

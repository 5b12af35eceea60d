//! What log lines and metric samples feed the engine: recognised log events (router answers,
//! switch lines, follower-read switches, evidence lines) and the series and samples the
//! metric detectors and the namespace states read.

use super::*;

impl Engine<'_> {
    /// A recognised log line ([`crate::log_events`]). A router's NoNamenodesAvailable line
    /// without trace context is one of its answers to `no_namenodes_window`, ordered by time
    /// with the answers of its traced spans.
    pub fn push_log_event(&mut self, event: &crate::log_events::LogEvent) {
        self.stats.log_events += 1;
        let time = event.time_unix_nano;
        if time > self.watermark {
            self.watermark = time;
        }
        if time.saturating_add(self.horizon) < self.watermark {
            self.stats.late_log_events += 1;
        }
        while let Some(&(oldest, _)) = self.recent_lines.front()
            && oldest.saturating_add(self.horizon) < self.watermark
        {
            let expired = self.recent_lines.pop_front().expect("a front was just read");
            self.recent_line_set.remove(&expired);
        }
        let identity = event.identity();
        if !self.recent_line_set.insert(identity) {
            self.stats.duplicates += 1;
            return;
        }
        self.recent_lines.push_back(identity);
        let cluster = self.interner.intern_opt(event.cluster.as_deref());
        self.data_ends.call_or_line(cluster, time);
        if event.kind.is_evidence() {
            let at = self.evidence_lines.partition_point(|earlier| earlier.time_unix_nano <= time);
            self.evidence_lines.insert(at, event.clone());
            if self.evidence_lines.len() > crate::log_events::MAX_EVIDENCE_LINES {
                self.evidence_lines.pop_front();
            }
        }
        if self.kinds.follower_read_disabled
            && event.kind == crate::log_events::LogEventKind::FollowerReadDisabled
            && let Some(client) = event.client_id.as_deref()
        {
            let client = self.interner.intern(client);
            let peer = self.interner.intern_opt(event.fields.get("peer").map(String::as_str));
            let lines = self.logged_disables.entry(client).or_default();
            let at = lines.partition_point(|(earlier, _)| *earlier <= time);
            lines.insert(at, (time, peer));
        }
        if self.kinds.failover_flapping
            && event.kind == crate::log_events::LogEventKind::ClusterSwitch
            && (event.client_id.is_some() || event.node_id.is_some())
        {
            let line = SwitchLine {
                process: (
                    self.interner.intern_opt(event.cluster.as_deref()),
                    self.interner.intern_opt(event.node_id.as_deref()),
                ),
                named: self.interner.intern_opt(event.client_id.as_deref()),
                judged: None,
                event: event.clone(),
            };
            self.unjudged_switches.push(self.log_switches.len());
            self.log_switches.push(line);
        }
        if self.kinds.no_namenodes_window
            && let Some(router) = event.router_answer()
        {
            self.sequence += 1;
            let key = (
                self.interner.intern_opt(event.cluster.as_deref()),
                self.interner.intern_opt(event.namespace.as_deref()),
                self.interner.intern(router),
            );
            let tried = self.interner.intern_opt(event.fields.get("namenode").map(String::as_str));
            let answer = Answer {
                start: time,
                order: self.sequence,
                end: time,
                no_namenodes: true,
                client: Sym::NONE,
                tried,
                logged: true,
            };
            self.answers.push(RouterAnswer(answer, key));
        }
        if self.watermark >= self.next_advance {
            self.next_advance = self.watermark.saturating_add(1_000_000_000);
            self.advance();
        }
    }

    /// Registers a metric series; samples name it by the returned id.
    pub fn define_series(&mut self, def: &SeriesDef) -> u32 {
        if let Some(id) = self.series_ids.get(def) {
            return *id;
        }
        let label = |key: &str| {
            def.labels.iter().find(|(name, _)| self.interner.get(*name) == Some(key)).map_or(Sym::NONE, |(_, v)| *v)
        };
        let (cluster, namespace, node) = (label(CLUSTER), label(NAMESPACE), label(NODE_ID));
        let name = self.interner.get(def.name).unwrap_or_default();
        let role = if name == METRIC_PROBE_UP {
            let text = |key: &str| self.interner.get(label(key)).unwrap_or_default().to_string();
            SeriesRole::Probe((
                self.interner.owned(cluster),
                self.interner.owned(namespace),
                self.interner.owned(node),
                text(blind_failover_probe::SERVER_ADDRESS),
                text(blind_failover_probe::PROBE_KIND),
                text(blind_failover_probe::CLIENT_ID),
            ))
        } else if name == METRIC_COMMITTED_STATE {
            SeriesRole::Committed
        } else if name == METRIC_ROLE {
            SeriesRole::Role { active: label(NODE_ROLE) == known::ACTIVE }
        } else {
            SeriesRole::Ignored
        };
        let id = u32::try_from(self.series.len()).expect("fewer than 2^32 series");
        if let Some(metrics) = &mut self.metrics {
            metrics.define(id, def, &self.interner);
        }
        self.series_ids.insert(def.clone(), id);
        self.series.push(SeriesInfo { role, cluster, namespace, node });
        id
    }

    /// Takes one numeric sample of a series from [`Engine::define_series`].
    pub fn push_sample(&mut self, sample: SampleRec) {
        self.stats.samples += 1;
        let Some(series) = self.series.get(sample.series as usize) else { return };
        self.data_ends.sample(series.cluster, series.node.is_some().then_some(series.node), sample.time);
        let key = (series.cluster, series.namespace);
        if let Some(metrics) = &mut self.metrics {
            metrics.push(sample.series, sample.time, sample.value, &self.interner, self.config);
        }
        match &series.role {
            SeriesRole::Ignored => {}
            SeriesRole::Probe(key) => {
                // In time order, one verdict a timestamp (the first, as every series keeps; a
                // request sent again brings the same ones).
                let points = self.probes.entry(key.clone()).or_default();
                let at = points.partition_point(|(time, _)| *time <= sample.time);
                if at == 0 || points[at - 1].0 != sample.time {
                    points.insert(at, (sample.time, sample.value));
                }
            }
            SeriesRole::Committed => {
                self.namespaces.entry(key).or_default().committed.report(sample.time, sample.value as StateId);
            }
            SeriesRole::Role { active: true } => {
                self.sequence += 1;
                let node = series.node;
                let fact = Fact { at: sample.time, node, order: self.sequence, client: Sym::NONE };
                self.namespaces.entry(key).or_default().active_reported.push(fact);
            }
            SeriesRole::Role { active: false } => {}
        }
    }

    /// Takes a model sample (numeric points only; the metric detectors read nothing else).
    pub fn push_model_sample(&mut self, sample: &Sample) {
        let PointValue::Number(value) = &sample.value else { return };
        let mut labels: Vec<(Sym, Sym)> = sample
            .series
            .labels
            .iter()
            .map(|(key, value)| (self.interner.intern(key), self.interner.intern(value)))
            .collect();
        labels.sort_unstable();
        let def = SeriesDef { name: self.interner.intern(&sample.series.name), kind: sample.meta.kind, labels };
        let series = self.define_series(&def);
        self.push_sample(SampleRec { series, time: sample.time_unix_nano, value: *value });
    }
}

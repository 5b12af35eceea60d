//! How the simulator's export requests are delivered: held back, out of order, from clocks
//! that disagree, sent twice or lost, as a collector fed by many batch exporters delivers
//! them. `lagscope eval` holds the detectors to such deliveries; `lagscope sim` sends them so
//! to a file or a live `serve`.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use anyhow::bail;
use lagscope_analyzer::AnalyzerConfig;
use lagscope_sim::{Nanos, Request, Rng, Sink};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::{
    ExponentialHistogramDataPoint, HistogramDataPoint, NumberDataPoint, SummaryDataPoint,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

/// How the simulator's export requests reach the analyzer (`eval`), or the file or endpoint
/// `sim` sends them to.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Delivery {
    /// Each request is held back a random time up to this (drawn from the run's seed), so the
    /// analyzer meets the processes' batches out of order, as from a collector fed by many
    /// batch exporters. 0: in the order they were made.
    pub max_delay: Nanos,
    /// Each process's clock is off by a random amount up to this, either way (drawn from the
    /// run's seed and the process's resource): its spans, span events, metric points and log
    /// records carry the skewed times, as from hosts whose clocks NTP keeps only roughly in step.
    /// 0: every process on the true time.
    pub max_skew: Nanos,
    /// This fraction of the export requests (drawn from the run's seed) is delivered twice, the
    /// copy a random time up to `max_delay` (at least 1 s) after the request was made, as when
    /// an exporter retries a request whose acknowledgement was lost (OTLP delivery is at least
    /// once): the spans, samples and log records come again with their ids. 0: each once.
    pub redeliver: f64,
    /// This fraction of the export requests (drawn from the run's seed) is never delivered, as
    /// when an exporter gives up after its retries or a collector sheds load: spans, samples and
    /// log records go missing. Anomalies whose evidence was lost may be missed (the score then
    /// judges only what is reported: see [`crate::eval::ScenarioScore::clean`]). 0: nothing lost.
    pub lose: f64,
}

impl Delivery {
    /// Refuses what cannot be delivered: fractions outside their range, a negative delay, a
    /// skew beyond a minute.
    pub fn check(&self) -> anyhow::Result<()> {
        if !(0.0..=1.0).contains(&self.redeliver) {
            bail!("--redeliver {}: must be a fraction between 0 and 1", self.redeliver);
        }
        if !(0.0..1.0).contains(&self.lose) {
            bail!("--lose {}: must be a fraction from 0 up to (not including) 1", self.lose);
        }
        if !(0..=60 * lagscope_sim::SECOND).contains(&self.max_skew) {
            bail!("--clock-skew {:.3} s: must be between 0 and 60 s", self.max_skew as f64 / 1e9);
        }
        if self.max_delay < 0 {
            bail!("--export-delay {:.3} s: must be at least 0", self.max_delay as f64 / 1e9);
        }
        Ok(())
    }

    /// [`Delivery::check`], and refuses a delay the streaming engine (`eval`, `analyze`) is not
    /// built to absorb: requests held back longer than its lateness less the simulator's 1 s
    /// export interval may arrive after their spans' joins (and then are rightly analyzed
    /// differently). Clocks that disagree take from that lateness too: the data's time is the
    /// fastest clock's, and a span from the slowest arrives up to twice the skew further behind
    /// it (found by a sweep: skew 800 ms with a delay of 9 s left `mixed` seed 908's hops to
    /// three reads unjoined). (`sim` checks only [`Delivery::check`]: the live analyzer of `serve`
    /// reads anew what late spans belong to.)
    pub fn validate(&self, analyzer: &AnalyzerConfig) -> anyhow::Result<()> {
        self.check()?;
        let lateness = analyzer.stream.lateness_seconds;
        let behind = self.copy_delay().saturating_add(lagscope_sim::SECOND).saturating_add(2 * self.max_skew);
        if behind > lateness * lagscope_sim::SECOND {
            let skew = match self.max_skew {
                0 => String::new(),
                skew => format!(" with --clock-skew {:.3} s", skew as f64 / 1e9),
            };
            bail!(
                "--export-delay {:.3} s{skew}: a span may then arrive {:.3} s behind the fastest clock (the delay, \
                 the simulator's 1 s export interval and twice the skew), more than \
                 analyzer.stream.lateness_seconds ({lateness} s) waits for",
                self.max_delay as f64 / 1e9,
                behind as f64 / 1e9
            );
        }
        Ok(())
    }

    /// How long after its request a redelivered copy may come.
    fn copy_delay(&self) -> Nanos {
        if self.redeliver > 0.0 { self.max_delay.max(lagscope_sim::SECOND) } else { self.max_delay }
    }
}

/// A [`Sink`] that passes the requests made on to `inner` as [`Delivery`] says: each held
/// back, skewed, sent twice or lost as drawn from the run's seed, and passed on (with the
/// time it falls due) once the run has made requests that late. [`Delivered::finish`] passes
/// on what is still held.
pub struct Delivered<S> {
    inner: S,
    delivery: Delivery,
    delays: Rng,
    /// Which requests are redelivered, and when.
    copies: Rng,
    /// Which requests are lost.
    losses: Rng,
    /// Requests held back, by when they are delivered and in what order made.
    held: BTreeMap<(Nanos, u64), Request>,
    sequence: u64,
    skew_seed: u64,
}

impl<S: Sink> Delivered<S> {
    /// Delivering to `inner` as `delivery` says, drawn from the run's `seed`.
    pub fn new(inner: S, delivery: Delivery, seed: u64) -> Self {
        Self {
            inner,
            delivery,
            delays: Rng::new(seed ^ 0xDE1A_7ED0),
            copies: Rng::new(seed ^ 0xC0_91E5),
            losses: Rng::new(seed ^ 0x0010_55E5),
            held: BTreeMap::new(),
            sequence: 0,
            skew_seed: seed ^ 0x5CE4_C10C,
        }
    }

    /// Passes on everything still held (in the order it falls due) and gives `inner` back.
    pub fn finish(mut self) -> S {
        self.deliver_through(Nanos::MAX);
        self.inner
    }

    fn hold(&mut self, due: Nanos, request: Request) {
        self.sequence += 1;
        self.held.insert((due, self.sequence), request);
    }

    /// Passes on the held requests due by `at`, in the order they fall due.
    fn deliver_through(&mut self, at: Nanos) {
        while let Some(entry) = self.held.first_entry()
            && entry.key().0 <= at
        {
            let due = entry.key().0;
            let request = entry.remove();
            self.inner.export(due, request);
        }
    }
}

impl<S: Sink> Sink for Delivered<S> {
    fn export(&mut self, at: Nanos, mut request: Request) {
        if self.delivery.lose > 0.0 && self.losses.chance(self.delivery.lose) {
            // Never received: neither delivered nor sent again.
            self.deliver_through(at);
            return;
        }
        if self.delivery.max_skew > 0 {
            skew(&mut request, self.skew_seed, self.delivery.max_skew);
        }
        if self.delivery.redeliver > 0.0 && self.copies.chance(self.delivery.redeliver) {
            let delay = self.copies.range(0, self.delivery.copy_delay());
            self.hold(at.saturating_add(delay), request.clone());
        }
        if self.delivery.max_delay == 0 {
            self.deliver_through(at);
            self.inner.export(at, request);
            return;
        }
        let delay = self.delays.range(0, self.delivery.max_delay);
        self.hold(at.saturating_add(delay), request);
        self.deliver_through(at);
    }
}

/// Shifts every time in `request` by its process's clock offset: uniform in
/// `[-max_skew, max_skew]`, drawn from `seed` and the process's resource (the same for every
/// request of the process).
fn skew(request: &mut Request, seed: u64, max_skew: Nanos) {
    let offset = |resource: &Option<Resource>| {
        let mut hasher = std::hash::DefaultHasher::new();
        for attribute in resource.iter().flat_map(|resource| &resource.attributes) {
            attribute.key.hash(&mut hasher);
            format!("{:?}", attribute.value).hash(&mut hasher);
        }
        Rng::new(seed ^ hasher.finish()).range(-max_skew, max_skew)
    };
    let shift = |time: &mut u64, offset: i64| {
        if *time != 0 {
            *time = time.saturating_add_signed(offset);
        }
    };
    match request {
        Request::Traces(request) => {
            for resource in &mut request.resource_spans {
                let offset = offset(&resource.resource);
                for span in resource.scope_spans.iter_mut().flat_map(|scope| &mut scope.spans) {
                    shift(&mut span.start_time_unix_nano, offset);
                    shift(&mut span.end_time_unix_nano, offset);
                    for event in &mut span.events {
                        shift(&mut event.time_unix_nano, offset);
                    }
                }
            }
        }
        Request::Metrics(request) => {
            for resource in &mut request.resource_metrics {
                let offset = offset(&resource.resource);
                for metric in resource.scope_metrics.iter_mut().flat_map(|scope| &mut scope.metrics) {
                    let points: Vec<(&mut u64, &mut u64)> = match &mut metric.data {
                        Some(Data::Gauge(gauge)) => gauge.data_points.iter_mut().map(Times::times).collect(),
                        Some(Data::Sum(sum)) => sum.data_points.iter_mut().map(Times::times).collect(),
                        Some(Data::Histogram(histogram)) => {
                            histogram.data_points.iter_mut().map(Times::times).collect()
                        }
                        Some(Data::ExponentialHistogram(histogram)) => {
                            histogram.data_points.iter_mut().map(Times::times).collect()
                        }
                        Some(Data::Summary(summary)) => summary.data_points.iter_mut().map(Times::times).collect(),
                        None => Vec::new(),
                    };
                    for (start, time) in points {
                        shift(start, offset);
                        shift(time, offset);
                    }
                }
            }
        }
        Request::Logs(request) => {
            for resource in &mut request.resource_logs {
                let offset = offset(&resource.resource);
                for record in resource.scope_logs.iter_mut().flat_map(|scope| &mut scope.log_records) {
                    shift(&mut record.time_unix_nano, offset);
                    shift(&mut record.observed_time_unix_nano, offset);
                }
            }
        }
    }
}

/// A data point's start and time, to shift.
trait Times {
    fn times(&mut self) -> (&mut u64, &mut u64);
}

macro_rules! times {
    ($($point:ty),*) => {$(
        impl Times for $point {
            fn times(&mut self) -> (&mut u64, &mut u64) {
                (&mut self.start_time_unix_nano, &mut self.time_unix_nano)
            }
        }
    )*};
}

times!(NumberDataPoint, HistogramDataPoint, ExponentialHistogramDataPoint, SummaryDataPoint);

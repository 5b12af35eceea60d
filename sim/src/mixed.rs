//! `mixed`: every scenario at once, each in a cluster of its own, plus background load; the
//! demo and the load generator. `--clients` and `--rate` scale the background load.
//!
//! Each scenario runs on its own thread into a bounded channel; the streams are merged by
//! simulated time (ties by scenario order), so the output is deterministic and memory stays
//! bounded however long the run. Cluster names and client ids are prefixed with the
//! scenario's name so that the scenarios do not mix: `hdfs-publish-race.hdfs-prod`.

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use crate::emit::{Request, Sink};
use crate::{Nanos, SECOND, ScenarioInfo, SimConfig, Truth};

pub const SCENARIO: ScenarioInfo = ScenarioInfo {
    name: "mixed",
    system: "all",
    summary: "every scenario at once across clusters, plus background HDFS load scaled by --clients and --rate",
};

/// Where the background load comes from.
const BACKGROUND: &str = "hdfs-observer-healthy";

struct ChannelSink(SyncSender<(Nanos, Request)>);

impl Sink for ChannelSink {
    fn export(&mut self, at: Nanos, request: Request) {
        // The merger only stops reading when the process is going away.
        let _ = self.0.send((at, request));
    }
}

/// A member scenario: its name, its requests as they come, and its truth at the end.
type Stream = (String, Receiver<(Nanos, Request)>, std::thread::JoinHandle<Truth>);

pub fn run(config: &SimConfig, sink: &mut dyn Sink, members: &[ScenarioInfo]) -> Truth {
    let duration = config.duration.unwrap_or(200 * SECOND);
    let mut streams: Vec<Stream> = Vec::new();
    let mut names: Vec<&str> = members.iter().map(|info| info.name).filter(|name| *name != BACKGROUND).collect();
    names.push(BACKGROUND);
    for (index, name) in names.iter().enumerate() {
        let mut member = SimConfig::new(name);
        member.seed = config.seed.wrapping_add(index as u64 * 7919);
        member.start_unix_nano = config.start_unix_nano;
        member.duration = Some(duration);
        member.name_prefix = Some(name.to_string());
        if *name == BACKGROUND {
            member.clients = config.clients;
            member.rate = config.rate;
        }
        let (sender, receiver) = sync_channel(64);
        let handle = std::thread::spawn(move || {
            let mut sink = ChannelSink(sender);
            crate::run(&member, &mut sink).unwrap_or_default()
        });
        streams.push((name.to_string(), receiver, handle));
    }
    // k-way merge by simulated time.
    let mut heads: Vec<Option<(Nanos, Request)>> =
        streams.iter().map(|(_, receiver, _)| receiver.recv().ok()).collect();
    loop {
        let next = heads.iter().enumerate().filter_map(|(index, head)| head.as_ref().map(|(at, _)| (*at, index))).min();
        let Some((_, index)) = next else { break };
        if let Some((at, request)) = heads[index].take() {
            sink.export(at, request);
        }
        heads[index] = streams[index].1.recv().ok();
    }
    let mut truth = Truth {
        start_unix_nano: config.start_unix_nano,
        end_unix_nano: config.start_unix_nano + duration,
        ..Truth::default()
    };
    let mut spans = 0;
    for (name, _, handle) in streams {
        let member = handle.join().unwrap_or_default();
        spans += member.figures.get("spans").and_then(|value| value.as_u64()).unwrap_or(0);
        truth.anomalies.extend(member.anomalies);
        for (figure, value) in member.figures {
            truth.figures.insert(format!("{name}.{figure}"), value);
        }
    }
    truth.figure("spans", spans);
    truth
}

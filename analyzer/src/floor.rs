//! The floor under each call of a session: what the client had already seen.
//!
//! read-your-writes: a read must be served at a state >= every state returned by the
//! client's earlier writes. monotonic reads: >= the state that served its earlier reads.
//! "Earlier" means completed (the client had the response) before the call started; calls
//! that overlap are concurrent and order nothing.

use lagscope_model::{Op, Outcome, StateId, TimelineAttempt, TimelineCall, UnixNanos};

/// Which guarantee a contribution to the floor stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloorSource {
    /// A state an earlier write returned (read-your-writes).
    Write,
    /// A state that served an earlier read (monotonic reads).
    Read,
}

/// The call (and attempt) that raised the floor to `state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloorContribution {
    pub state: StateId,
    pub call_index: usize,
    pub attempt_index: usize,
    pub source: FloorSource,
    /// When the client had the response.
    pub completed_unix_nano: UnixNanos,
}

/// The two floors in force when a call started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallFloors {
    pub writes: Option<FloorContribution>,
    pub reads: Option<FloorContribution>,
}

impl CallFloors {
    /// The higher of the two floors.
    pub fn highest(&self) -> Option<FloorContribution> {
        match (self.writes, self.reads) {
            (Some(writes), Some(reads)) => Some(if reads.state > writes.state { reads } else { writes }),
            (writes, reads) => writes.or(reads),
        }
    }

    /// The floor a read served at `served` breaks by at least `min_behind` states, if any.
    pub fn broken_by(&self, served: StateId, min_behind: StateId) -> Option<FloorContribution> {
        // read-your-writes first: it is the stronger promise to the user.
        [self.writes, self.reads]
            .into_iter()
            .flatten()
            .find(|floor| floor.state.saturating_sub(served) >= min_behind.max(1))
    }

    pub(crate) fn raise(&mut self, contribution: FloorContribution) {
        let slot = match contribution.source {
            FloorSource::Write => &mut self.writes,
            FloorSource::Read => &mut self.reads,
        };
        if slot.is_none_or(|current| contribution.state > current.state) {
            *slot = Some(contribution);
        }
    }
}

/// A read attempt that was served, with the floors in force when its call started.
pub struct ServedRead<'a> {
    pub call: &'a TimelineCall,
    pub floors: CallFloors,
    pub attempt: &'a TimelineAttempt,
    pub served: StateId,
}

impl ServedRead<'_> {
    /// Whether the read broke read-your-writes or monotonic reads by at least `min_behind`.
    pub fn broken_floor(&self, min_behind: StateId) -> Option<FloorContribution> {
        self.floors.broken_by(self.served, min_behind)
    }
}

/// Every successful read attempt of a timeline's calls that reports the state that served it,
/// in client order.
pub fn served_reads(calls: &[TimelineCall]) -> Vec<ServedRead<'_>> {
    calls
        .iter()
        .zip(floors(calls))
        .flat_map(|(call, call_floors)| {
            served_of(call).map(move |(attempt, served)| ServedRead { call, floors: call_floors, attempt, served })
        })
        .collect()
}

/// A read call's successful attempts that report the state that served them, with that state
/// (none for other calls).
pub fn served_of(call: &TimelineCall) -> impl Iterator<Item = (&TimelineAttempt, StateId)> {
    let read = call.op == Some(Op::Read);
    successful(call).filter(move |_| read).filter_map(|(_, attempt)| Some((attempt, attempt.served?)))
}

/// The floors in force at the start of each call. `calls` must be in client order (start).
pub fn floors(calls: &[TimelineCall]) -> Vec<CallFloors> {
    let contributions =
        calls.iter().enumerate().filter_map(|(call_index, call)| contribution(call_index, call)).collect();
    sweep(calls, contributions, CallFloors::default(), CallFloors::raise)
}

/// The highest state any earlier completed call returned to the client, at the start of each
/// call: what it has already seen, and so the least it should carry.
pub fn seen_before(calls: &[TimelineCall]) -> Vec<Option<FloorContribution>> {
    let contributions = calls
        .iter()
        .enumerate()
        .filter_map(|(call_index, call)| {
            successful(call)
                .filter_map(|(attempt_index, attempt)| {
                    Some(FloorContribution {
                        state: attempt.returned?,
                        call_index,
                        attempt_index,
                        source: if call.op == Some(Op::Write) { FloorSource::Write } else { FloorSource::Read },
                        completed_unix_nano: attempt.end_unix_nano,
                    })
                })
                .max_by_key(|contribution| contribution.state)
        })
        .collect();
    sweep(calls, contributions, None, |seen: &mut Option<FloorContribution>, contribution| {
        if seen.is_none_or(|current| contribution.state > current.state) {
            *seen = Some(contribution);
        }
    })
}

/// Walks the calls in client order, folding in each contribution once its call completed
/// before the call at hand started.
fn sweep<T: Copy>(
    calls: &[TimelineCall],
    mut contributions: Vec<FloorContribution>,
    initial: T,
    raise: impl Fn(&mut T, FloorContribution),
) -> Vec<T> {
    contributions.sort_by_key(|contribution| contribution.completed_unix_nano);
    let mut result = Vec::with_capacity(calls.len());
    let mut current = initial;
    let mut next = 0;
    for call in calls {
        while next < contributions.len() && contributions[next].completed_unix_nano <= call.start_unix_nano {
            raise(&mut current, contributions[next]);
            next += 1;
        }
        result.push(current);
    }
    result
}

/// What a completed call adds to the floor: a write's returned state, a read's served state.
fn contribution(call_index: usize, call: &TimelineCall) -> Option<FloorContribution> {
    let source = match call.op.as_ref()? {
        Op::Write => FloorSource::Write,
        Op::Read => FloorSource::Read,
        _ => return None,
    };
    successful(call)
        .filter_map(|(attempt_index, attempt)| {
            let state = match source {
                FloorSource::Write => attempt.returned,
                FloorSource::Read => attempt.served,
            };
            Some(FloorContribution {
                state: state?,
                call_index,
                attempt_index,
                source,
                completed_unix_nano: attempt.end_unix_nano,
            })
        })
        .max_by_key(|contribution| contribution.state)
}

fn successful(call: &TimelineCall) -> impl Iterator<Item = (usize, &TimelineAttempt)> {
    call.attempts.iter().enumerate().filter(|(_, attempt)| attempt.outcome == Some(Outcome::Ok))
}

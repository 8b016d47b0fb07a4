//! What a stall case observed, and what it must not have seen.

use http::StatusCode;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Who {
    A,
    B,
}

/// One answer for the case's key.
#[derive(Clone, Debug)]
pub(super) struct Answer {
    pub(super) who: Who,
    /// `None`: no answer (a timeout, a handler error), said in `code`.
    pub(super) status: Option<StatusCode>,
    pub(super) code: String,
    pub(super) replayed: bool,
    pub(super) body: String,
}

impl Answer {
    pub(super) fn created(&self) -> bool {
        self.status == Some(StatusCode::CREATED)
    }

    fn allowed(&self) -> bool {
        match self.status.map(|s| s.as_u16()) {
            Some(201) => true,
            Some(409) => self.code == "idempotency_in_progress",
            // The second only after a handler ran and its commit's outcome is
            // unknown (transactional mode): the retry replays or runs once.
            Some(503) => {
                self.code == "idempotency_store_unavailable"
                    || self.code == "idempotency_outcome_unknown"
            }
            _ => false,
        }
    }

    fn run(&self) -> Option<u64> {
        let json: serde_json::Value = serde_json::from_str(&self.body).ok()?;
        json["run"].as_u64()
    }

    pub(super) fn short(&self) -> String {
        match (self.status, self.created()) {
            (Some(_), true) => {
                let how = if self.replayed { "replay" } else { "201" };
                format!("{how} run {}", self.run().unwrap_or(0))
            }
            (Some(status), false) => format!("{} {}", status.as_u16(), self.code),
            (None, _) => self.code.clone(),
        }
    }
}

/// What a case saw: every answer for its key (the two final retries last),
/// who ran the handler, the effects that stayed, when the key was free.
pub(super) struct Observed {
    pub(super) answers: Vec<Answer>,
    pub(super) finals: [Answer; 2],
    pub(super) runs: Vec<Who>,
    pub(super) effects: usize,
    pub(super) free_after: Option<Duration>,
}

impl Observed {
    pub(super) fn violations(&self, strict: bool) -> Vec<String> {
        let mut violations = Vec::new();
        for answer in &self.finals {
            if !answer.created() {
                violations.push(format!(
                    "{:?} retried at the end: {}",
                    answer.who,
                    answer.short()
                ));
            }
        }
        for answer in self.all().filter(|answer| !answer.allowed()) {
            violations.push(format!("{:?} answered {}", answer.who, answer.short()));
        }
        let created: Vec<&Answer> = self.all().filter(|a| a.created()).collect();
        let bodies = |answers: &[&Answer]| {
            let mut bodies: Vec<String> = answers.iter().map(|a| a.short()).collect();
            bodies.sort();
            bodies.dedup();
            bodies
        };
        let record = &self.finals[1];
        if strict {
            if self.effects != 1 {
                violations.push(format!("{} effects, not exactly one", self.effects));
            }
            if created.iter().any(|a| a.body != record.body) {
                violations.push(format!("2xx with different bodies: {:?}", bodies(&created)));
            }
        } else {
            // Fencing: the record is the last run's (a late completion of an
            // earlier run was refused), and every replay is it.
            let replays: Vec<&Answer> = created.iter().copied().filter(|a| a.replayed).collect();
            if self.effects == 0 {
                violations.push("no effect".to_owned());
            }
            if record.run() != Some(self.runs.len() as u64) {
                violations.push(format!(
                    "the record is run {:?} of {}: the last run's record was lost",
                    record.run(),
                    self.runs.len()
                ));
            }
            if replays.iter().any(|a| a.body != record.body) {
                violations.push(format!("replays differ: {:?}", bodies(&replays)));
            }
        }
        violations
    }

    fn all(&self) -> impl Iterator<Item = &Answer> {
        self.answers.iter().chain(&self.finals)
    }

    /// `A: <its first answer> | B: <its answers, counted> | runs | effects | free`.
    pub(super) fn line(&self, fraction: f64) -> String {
        let first_of_a = self
            .answers
            .iter()
            .find(|answer| answer.who == Who::A)
            .map_or_else(|| "none".to_owned(), Answer::short);
        let mut of_b: Vec<(String, usize)> = Vec::new();
        for answer in self.all().filter(|a| a.who == Who::B) {
            let kind = answer.short();
            match of_b.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, n)) => *n += 1,
                None => of_b.push((kind, 1)),
            }
        }
        let of_b: Vec<String> = of_b
            .iter()
            .map(|(kind, n)| format!("{n}x {kind}"))
            .collect();
        let runs: Vec<String> = self.runs.iter().map(|who| format!("{who:?}")).collect();
        let free = self.free_after.map_or_else(
            || "never".to_owned(),
            |t| format!("{} ms after thaw", t.as_millis()),
        );
        format!(
            "{fraction} lock | A: {first_of_a} | B: {} | runs {} | effects {} | free {free}",
            of_b.join(", "),
            runs.join("+"),
            self.effects,
        )
    }
}

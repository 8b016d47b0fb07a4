use crate::telemetry::Label;

/// What the lease layer did with a start, as its events and metrics label it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum JobOutcome {
    /// A new job was created and its handler called.
    Created,
    /// A live job was joined; nothing new started.
    Joined,
    /// An expired lease was taken over and the handler called.
    Stolen,
    /// The job had completed: its artifact id was answered.
    Completed,
    /// `429 budget_exhausted`.
    BudgetExhausted,
    /// The start handler refused, failed or panicked; the job was failed.
    StartFailed,
    /// `503 job_store_unavailable`.
    StoreError,
    /// Refused before the store was asked: no tenant, a bad key or body.
    Rejected,
}

impl JobOutcome {
    /// The label used in events and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Joined => "joined",
            Self::Stolen => "stolen",
            Self::Completed => "completed",
            Self::BudgetExhausted => "budget_exhausted",
            Self::StartFailed => "start_failed",
            Self::StoreError => "store_error",
            Self::Rejected => "rejected",
        }
    }
}

impl Label for JobOutcome {
    fn as_str(self) -> &'static str {
        JobOutcome::as_str(self)
    }

    fn is_store_error(self) -> bool {
        self == Self::StoreError
    }
}

impl From<crate::response::Refusal> for JobOutcome {
    fn from(refusal: crate::response::Refusal) -> Self {
        use crate::response::Refusal;
        match refusal {
            Refusal::JobStoreUnavailable => Self::StoreError,
            Refusal::BudgetExhausted => Self::BudgetExhausted,
            _ => Self::Rejected,
        }
    }
}

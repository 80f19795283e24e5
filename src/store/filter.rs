//! What a listing asks for and what it gets back: the filter shared by listings and bulk
//! replay, and a page of messages with its cursor.

use super::{MessageRecord, State};

/// A page of messages.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// The messages, in id order.
    pub items: Vec<MessageRecord>,
    /// Where the next page starts, if there may be one.
    pub next_cursor: Option<String>,
}

/// Filter for [`Store::list`](super::Store::list) and [`Store::replay_dead`](super::Store::replay_dead).
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only this state.
    pub state: Option<State>,
    /// Only this endpoint.
    pub endpoint: Option<String>,
    /// Only messages finished at or after this time (millis).
    pub finished_since_ms: Option<u64>,
    /// Only messages finished before this time (millis).
    pub finished_until_ms: Option<u64>,
}

impl ListFilter {
    pub(super) fn matches(&self, rec: &MessageRecord) -> bool {
        self.state.is_none_or(|s| s == rec.state)
            && self.endpoint.as_deref().is_none_or(|e| e == rec.endpoint)
            && self.finished_since_ms.is_none_or(|t| rec.finished_at_ms >= t)
            && self.finished_until_ms.is_none_or(|t| rec.finished_at_ms < t)
    }
}

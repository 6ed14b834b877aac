//! Watches: newline-delimited JSON events of one kind after a
//! resourceVersion, with bookmarks, initial events and a timeout; a watch
//! from before the kept history ends with a 410 Gone `ERROR` event.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper::{Response, StatusCode};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::{Instant, Interval, MissedTickBehavior};

use super::http::{
    bad_request, check_params, event_line, filter, flag, status_object, Body, Refusal,
};
use super::store::{Filter, ServedKind};
use super::Shared;

/// Query parameters a watch accepts.
const WATCH_PARAMS: &[&str] = &[
    "watch",
    "labelSelector",
    "fieldSelector",
    "resourceVersion",
    "resourceVersionMatch",
    "allowWatchBookmarks",
    "sendInitialEvents",
    "timeoutSeconds",
];
/// How long a watch without `timeoutSeconds` lasts.
const DEFAULT_TIMEOUT_SECS: u64 = 1800;

/// A watch request, checked.
struct WatchRequest {
    filter: Filter,
    bookmarks: bool,
    initial_events: bool,
    timeout_secs: u64,
    /// The resourceVersion to resume after; `None` starts with the current
    /// objects.
    requested: Option<u64>,
}

/// Everything a running watch needs to produce its next lines.
struct WatchStream {
    shared: Arc<Shared>,
    kind: ServedKind,
    filter: Filter,
    since: u64,
    pending: VecDeque<Bytes>,
    changes: watch::Receiver<u64>,
    bookmarks: Option<Interval>,
    deadline: Instant,
    finished: bool,
}

pub(super) fn start(
    shared: &Arc<Shared>,
    kind: ServedKind,
    namespace: Option<String>,
    params: &BTreeMap<String, String>,
) -> Result<Response<Body>, Refusal> {
    let request = WatchRequest::parse(namespace, params)?;
    let WatchRequest {
        filter,
        bookmarks,
        initial_events,
        timeout_secs,
        requested,
    } = request;
    let changes = shared.changes.subscribe();
    let mut pending = VecDeque::new();
    let since = match requested {
        Some(since) if !initial_events => since,
        _ => {
            let store = shared.lock();
            for (_, object) in store.list(kind, &filter) {
                pending.push_back(event_line("ADDED", object));
            }
            if initial_events && bookmarks {
                pending.push_back(bookmark_line(kind, store.resource_version, true));
            }
            store.resource_version
        }
    };
    let interval = shared.lock_settings().bookmark_interval;
    let bookmarks = bookmarks.then(|| {
        let mut interval = tokio::time::interval_at(Instant::now() + interval, interval);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        interval
    });
    let stream = WatchStream {
        shared: Arc::clone(shared),
        kind,
        filter,
        since,
        pending,
        changes,
        bookmarks,
        deadline: Instant::now() + Duration::from_secs(timeout_secs),
        finished: false,
    };
    let body = futures::stream::unfold(stream, |mut stream| async move {
        let line = stream.next_line().await?;
        Some((Ok::<_, Infallible>(Frame::data(line)), stream))
    });
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(StreamBody::new(body).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed())))
}

impl WatchRequest {
    fn parse(
        namespace: Option<String>,
        params: &BTreeMap<String, String>,
    ) -> Result<Self, Refusal> {
        check_params(params, WATCH_PARAMS)?;
        let filter = filter(namespace, params)?;
        let bookmarks = flag(params, "allowWatchBookmarks")?;
        let initial_events = flag(params, "sendInitialEvents")?;
        let version_match = params.get("resourceVersionMatch").map(String::as_str);
        if initial_events && version_match != Some("NotOlderThan") {
            return Err(bad_request(
                "sendInitialEvents requires resourceVersionMatch=NotOlderThan".to_owned(),
            ));
        }
        if !initial_events && version_match.is_some() {
            return Err(bad_request(
                "resourceVersionMatch is only allowed on a watch with sendInitialEvents".to_owned(),
            ));
        }
        let timeout_secs = match params.get("timeoutSeconds") {
            Some(secs) => secs.parse::<u64>().map_err(|_| {
                bad_request(format!(
                    "timeoutSeconds {secs:?} is not a non-negative integer"
                ))
            })?,
            None => DEFAULT_TIMEOUT_SECS,
        };
        let version = params
            .get("resourceVersion")
            .filter(|v| !v.is_empty() && *v != "0");
        let requested =
            match version {
                Some(version) => Some(version.parse::<u64>().map_err(|_| {
                    bad_request(format!("resourceVersion {version:?} is not valid"))
                })?),
                None => None,
            };
        Ok(Self {
            filter,
            bookmarks,
            initial_events,
            timeout_secs,
            requested,
        })
    }
}

impl WatchStream {
    /// The next line to send, or `None` when the watch ends (timeout, 410
    /// Gone, or the server going away).
    async fn next_line(&mut self) -> Option<Bytes> {
        loop {
            if let Some(line) = self.pending.pop_front() {
                return Some(line);
            }
            if self.finished {
                return None;
            }
            self.collect_changes();
            if !self.pending.is_empty() || self.finished {
                continue;
            }
            let tick = async {
                match self.bookmarks.as_mut() {
                    Some(interval) => {
                        interval.tick().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = self.changes.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                }
                () = tick => self.pending.push_back(bookmark_line(self.kind, self.since, false)),
                () = tokio::time::sleep_until(self.deadline) => return None,
            }
        }
    }

    fn collect_changes(&mut self) {
        let store = self.shared.lock();
        match store.changes_since(self.kind, &self.filter, self.since) {
            Ok(events) => {
                for (event_type, object) in events {
                    self.pending
                        .push_back(event_line(event_type.as_str(), &object));
                }
                self.since = store.resource_version;
            }
            Err(expired) => {
                let message = format!(
                    "too old resource version: {} ({})",
                    expired.requested, expired.oldest
                );
                let status = status_object(StatusCode::GONE, "Expired", &message);
                self.pending.push_back(event_line("ERROR", &status));
                self.finished = true;
            }
        }
    }
}

fn bookmark_line(kind: ServedKind, resource_version: u64, initial_events_end: bool) -> Bytes {
    let mut metadata = json!({ "resourceVersion": resource_version.to_string() });
    if initial_events_end {
        metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
    }
    let object = json!({
        "apiVersion": kind.api_version(),
        "kind": kind.kind(),
        "metadata": metadata,
    });
    event_line("BOOKMARK", &object)
}

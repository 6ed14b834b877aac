//! The backoff's bounds, which errors are transient, and how an outage is
//! reported once across the watches.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use kube::core::Status;

use super::*;

fn status(code: u16) -> Box<Status> {
    Box::new(Status {
        code,
        ..Status::default()
    })
}

#[test]
fn delays_start_short_double_and_stay_between_one_and_one_and_a_quarter_seconds() {
    let mut backoff = Backoff::new();
    let delays: Vec<Duration> = (0..20).map(|_| backoff.next_delay()).collect();
    let steps = [200, 400, 800, 1000, 1000];
    for (delay, step) in delays.iter().zip(steps) {
        let step = Duration::from_millis(step);
        assert!(
            *delay >= step && *delay <= step + step / 4,
            "{delay:?} not in [{step:?}, +25%]: {delays:?}"
        );
    }
    for delay in &delays[3..] {
        assert!(
            *delay >= MAX_RETRY && *delay <= MAX_RETRY + MAX_RETRY / 4,
            "once the outage is long, one attempt a second at most: {delays:?}"
        );
    }
    assert!(
        delays[3..].windows(2).any(|pair| pair[0] != pair[1]),
        "the delays are jittered: {delays:?}"
    );
}

#[test]
fn a_success_starts_the_delays_over() {
    let mut backoff = Backoff::new();
    for _ in 0..10 {
        backoff.next_delay();
    }
    backoff.reset();
    assert!(backoff.next_delay() <= FIRST_RETRY + FIRST_RETRY / 4);
}

#[test]
fn a_starting_api_server_fails_transiently() {
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    let cases = [
        (watcher::Error::WatchError(status(410)), Failure::Expired),
        (watcher::Error::WatchError(status(403)), Failure::Transient),
        (
            watcher::Error::InitialListFailed(kube::Error::Api(status(403))),
            Failure::Transient,
        ),
        (
            watcher::Error::WatchStartFailed(kube::Error::Api(status(429))),
            Failure::Transient,
        ),
        (
            watcher::Error::WatchStartFailed(kube::Error::Api(status(503))),
            Failure::Transient,
        ),
        (
            watcher::Error::WatchFailed(kube::Error::ReadEvents(refused)),
            Failure::Transient,
        ),
        (
            watcher::Error::WatchStartFailed(kube::Error::Service("connection refused".into())),
            Failure::Transient,
        ),
        (
            watcher::Error::InitialListFailed(kube::Error::Api(status(404))),
            Failure::Other,
        ),
        (watcher::Error::NoResourceVersion, Failure::Other),
    ];
    for (error, expected) in cases {
        assert_eq!(Failure::of(&error), expected, "{error}");
    }
}

#[test]
fn an_outage_of_every_watch_is_reported_once_and_its_end_once() {
    let health = Health::new(3);
    let before = watch_failures();

    let reports: Vec<bool> = [
        ResourceKind::Service,
        ResourceKind::EndpointSlice,
        ResourceKind::Node,
        ResourceKind::Service,
        ResourceKind::Node,
    ]
    .into_iter()
    .map(|kind| health.failed(kind, "connection refused"))
    .collect();

    assert_eq!(reports, [false, false, true, false, false]);
    assert!(!health.recovered(ResourceKind::Service));
    assert!(!health.recovered(ResourceKind::Node));
    assert!(health.is_failing(ResourceKind::EndpointSlice));
    assert!(
        health.recovered(ResourceKind::EndpointSlice),
        "the last one back"
    );
    assert!(!health.is_failing(ResourceKind::EndpointSlice));
    let after = watch_failures();
    assert!(after.services >= before.services + 2);
    assert!(after.endpoint_slices > before.endpoint_slices);
    assert!(after.nodes >= before.nodes + 2);
}

#[test]
fn one_watch_failing_twice_is_reported_and_a_single_blip_is_not() {
    let health = Health::new(3);
    assert!(!health.failed(ResourceKind::Node, "reset"));
    assert!(
        !health.recovered(ResourceKind::Node),
        "a blip is not worth a line"
    );

    assert!(!health.failed(ResourceKind::Node, "reset"));
    assert!(health.failed(ResourceKind::Node, "reset"));
    assert!(!health.failed(ResourceKind::Node, "reset"));
    assert!(health.recovered(ResourceKind::Node));
}

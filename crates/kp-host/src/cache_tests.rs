//! The cache against a fake kernel: which calls dump, and which do not.
#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use pretty_assertions::assert_eq;

use super::*;
use crate::wire;

const NODE_IP: &str = "192.168.99.2";
const NEW_IP: &str = "192.168.99.20";

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// The kernel as the cache sees it: addresses, a notification queue, and
/// the dumps asked for.
#[derive(Default)]
struct Kernel {
    addresses: Vec<(u32, IpAddr)>,
    notifications: VecDeque<Notification>,
    dump_requests: usize,
    refuse_next_dump: bool,
}

#[derive(Clone, Default)]
struct FakeKernel(Arc<Mutex<Kernel>>);

impl FakeKernel {
    fn with(addresses: &[(u32, &str)]) -> Self {
        let kernel = Self::default();
        kernel.state().addresses = addresses.iter().map(|(i, a)| (*i, ip(a))).collect();
        kernel
    }

    fn state(&self) -> MutexGuard<'_, Kernel> {
        self.0.lock().unwrap()
    }

    /// `ip address add`, announced to subscribers.
    fn add(&self, index: u32, address: &str) {
        let mut state = self.state();
        state.addresses.push((index, ip(address)));
        state.notifications.push_back(Notification::Changed);
    }

    /// `ip address del`, announced to subscribers.
    fn remove(&self, address: &str) {
        let mut state = self.state();
        state.addresses.retain(|(_, a)| *a != ip(address));
        state.notifications.push_back(Notification::Changed);
    }

    /// A change whose notification did not fit in the queue.
    fn add_overflowing(&self, index: u32, address: &str) {
        let mut state = self.state();
        state.addresses.push((index, ip(address)));
        state.notifications.clear();
        state.notifications.push_back(Notification::Lost);
    }

    fn dump_requests(&self) -> usize {
        self.state().dump_requests
    }

    /// A cache over this kernel, and how often it opened its transport.
    fn cache(&self) -> (HostAddresses<FakeKernel>, Arc<AtomicUsize>) {
        let opened = Arc::new(AtomicUsize::new(0));
        let (kernel, count) = (self.clone(), Arc::clone(&opened));
        let cache = HostAddresses::with_opener(move || {
            count.fetch_add(1, Ordering::Relaxed);
            Ok(kernel.clone())
        });
        (cache, opened)
    }
}

impl RouteTransport for FakeKernel {
    fn dump_addresses(&mut self, on_message: &mut dyn FnMut(&[u8])) -> Result<(), HostError> {
        let mut state = self.state();
        state.dump_requests += 1;
        let sequence = state.dump_requests as u32;
        if std::mem::take(&mut state.refuse_next_dump) {
            return Err(HostError::Kernel(io::Error::from_raw_os_error(16)));
        }
        for (index, address) in &state.addresses {
            on_message(&wire::new_address(sequence, *index, *address, None));
        }
        Ok(())
    }

    fn next_notification(&mut self) -> Result<Notification, HostError> {
        let next = self.state().notifications.pop_front();
        Ok(next.unwrap_or(Notification::Nothing))
    }
}

#[track_caller]
fn assert_addresses(cache: &mut HostAddresses<FakeKernel>, expected: &[&str]) {
    let expected: Vec<IpAddr> = expected.iter().map(|a| ip(a)).collect();
    assert_eq!(cache.addresses().unwrap(), expected);
}

#[test]
fn without_a_notification_the_second_call_does_not_dump_again() {
    let kernel = FakeKernel::with(&[(1, "127.0.0.1"), (2, NODE_IP)]);
    let (mut cache, _) = kernel.cache();
    assert_addresses(&mut cache, &["127.0.0.1", NODE_IP]);
    assert_addresses(&mut cache, &["127.0.0.1", NODE_IP]);
    assert_addresses(&mut cache, &["127.0.0.1", NODE_IP]);
    assert_eq!(kernel.dump_requests(), 1);
    assert_eq!(cache.dumps(), 1);
}

#[test]
fn an_added_address_is_announced_and_dumped_once() {
    let kernel = FakeKernel::with(&[(2, NODE_IP)]);
    let (mut cache, _) = kernel.cache();
    assert_addresses(&mut cache, &[NODE_IP]);

    kernel.add(2, NEW_IP);
    assert_addresses(&mut cache, &[NODE_IP, NEW_IP]);
    assert_eq!(kernel.dump_requests(), 2);

    assert_addresses(&mut cache, &[NODE_IP, NEW_IP]);
    assert_eq!(kernel.dump_requests(), 2, "no change since: no dump");
}

#[test]
fn a_removed_address_is_forgotten() {
    let kernel = FakeKernel::with(&[(2, NODE_IP), (2, NEW_IP)]);
    let (mut cache, _) = kernel.cache();
    assert_addresses(&mut cache, &[NODE_IP, NEW_IP]);
    kernel.remove(NEW_IP);
    assert_addresses(&mut cache, &[NODE_IP]);
}

#[test]
fn lost_notifications_make_the_next_call_dump_again() {
    let kernel = FakeKernel::with(&[(2, NODE_IP)]);
    let (mut cache, _) = kernel.cache();
    assert_addresses(&mut cache, &[NODE_IP]);
    kernel.add_overflowing(2, NEW_IP);
    assert_addresses(&mut cache, &[NODE_IP, NEW_IP]);
    assert_eq!(kernel.dump_requests(), 2);
}

#[test]
fn many_notifications_cost_one_dump() {
    let kernel = FakeKernel::with(&[(2, NODE_IP)]);
    let (mut cache, _) = kernel.cache();
    cache.addresses().unwrap();
    for n in 10..60 {
        kernel.add(3, &format!("10.0.0.{n}"));
    }
    assert_eq!(cache.addresses().unwrap().len(), 51);
    assert_eq!(kernel.dump_requests(), 2);
}

#[test]
fn a_refresh_dumps_even_without_a_notification() {
    let kernel = FakeKernel::with(&[(2, NODE_IP)]);
    let (mut cache, _) = kernel.cache();
    cache.addresses().unwrap();
    // A change the queue never saw.
    kernel.state().addresses.push((2, ip(NEW_IP)));
    assert_addresses(&mut cache, &[NODE_IP]);
    assert_eq!(cache.refresh().unwrap(), [ip(NODE_IP), ip(NEW_IP)]);
    assert_eq!(kernel.dump_requests(), 2);
}

#[test]
fn the_transport_is_opened_on_first_use_and_again_after_a_failure() {
    let kernel = FakeKernel::with(&[(2, NODE_IP)]);
    let (mut cache, opened) = kernel.cache();
    assert_eq!(opened.load(Ordering::Relaxed), 0, "opened before first use");

    kernel.state().refuse_next_dump = true;
    let error = cache.addresses().unwrap_err();
    assert!(matches!(error, HostError::Kernel(_)), "unexpected: {error}");
    assert_eq!(opened.load(Ordering::Relaxed), 1);

    assert_addresses(&mut cache, &[NODE_IP]);
    assert_eq!(opened.load(Ordering::Relaxed), 2);
}

#[test]
fn an_address_on_many_interfaces_is_listed_once_and_the_list_is_sorted() {
    let kernel = FakeKernel::with(&[(3, "fe80::1"), (2, NODE_IP), (4, "fe80::1"), (1, "::1")]);
    let (mut cache, _) = kernel.cache();
    assert_addresses(&mut cache, &[NODE_IP, "::1", "fe80::1"]);
}

#[test]
fn a_message_that_cannot_be_decoded_fails_the_dump() {
    struct Garbled;
    impl RouteTransport for Garbled {
        fn dump_addresses(&mut self, on_message: &mut dyn FnMut(&[u8])) -> Result<(), HostError> {
            let mut message = wire::new_address(1, 2, ip(NODE_IP), None);
            // Claim an IFA_ADDRESS of 5 bytes.
            message[24..26].copy_from_slice(&9u16.to_ne_bytes());
            on_message(&wire::new_address(1, 2, ip(NEW_IP), None));
            on_message(&message);
            Ok(())
        }
        fn next_notification(&mut self) -> Result<Notification, HostError> {
            Ok(Notification::Nothing)
        }
    }
    let mut cache = HostAddresses::with_opener(|| Ok(Garbled));
    let error = cache.addresses().unwrap_err();
    assert!(matches!(error, HostError::Decode(_)), "unexpected: {error}");
}

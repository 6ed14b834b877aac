//! Whatever the text, parsing never panics and every error names the
//! file, the document and the line: random bytes, random YAML-ish text,
//! and random damage to a valid manifest.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;

use kp_source::parse_documents;
use proptest::prelude::*;

const VALID: &str = r#"# A valid manifest that the mutations start from.
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: web, labels: {app: web}}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  externalIPs: [203.0.113.5]
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: 30080, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: demo
  name: web-abc
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.244.1.11]
  conditions: {ready: true}
  nodeName: node-1
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Node, metadata: {name: node-1}, spec: {podCIDRs: [10.244.1.0/24]}}
- {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"ports": [{"port": 1}]}}
"#;

#[derive(Debug, Clone)]
enum Mutation {
    Delete(usize),
    Insert(usize, char),
    Replace(usize, char),
    SwapLines(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let interesting = prop::sample::select(vec![
        ':', '-', '{', '}', '[', ']', '\n', ' ', '\t', '"', '\'', '#', '&', '*', '!', '|', '>',
        '0', 'x', '%', '@', '\u{0}', 'é',
    ]);
    prop_oneof![
        any::<usize>().prop_map(Mutation::Delete),
        (any::<usize>(), interesting.clone()).prop_map(|(at, c)| Mutation::Insert(at, c)),
        (any::<usize>(), interesting).prop_map(|(at, c)| Mutation::Replace(at, c)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
    ]
}

fn apply(text: &str, mutation: &Mutation) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    match *mutation {
        Mutation::Delete(at) if !chars.is_empty() => {
            chars.remove(at % chars.len());
        }
        Mutation::Insert(at, c) => chars.insert(at % (chars.len() + 1), c),
        Mutation::Replace(at, c) if !chars.is_empty() => {
            let at = at % chars.len();
            chars[at] = c;
        }
        Mutation::SwapLines(a, b) => {
            let text: String = chars.iter().collect();
            let mut lines: Vec<&str> = text.lines().collect();
            if !lines.is_empty() {
                let len = lines.len();
                lines.swap(a % len, b % len);
            }
            return lines.join("\n");
        }
        _ => {}
    }
    chars.into_iter().collect()
}

/// Parses `text` as YAML and as JSON; every error must name the file, the
/// document and a line of the text.
fn parse_both_ways(text: &str) {
    let lines = text.lines().count().max(1);
    for file in ["fuzz.yaml", "fuzz.json"] {
        let (_, errors) = parse_documents(Path::new(file), text);
        for error in &errors {
            let location = &error.location;
            let message = error.to_string();
            assert_eq!(location.path, Path::new(file), "{message}");
            assert!(location.document.is_some(), "no document: {message}");
            let line = location.line.unwrap_or(0);
            assert!(
                (1..=lines + 1).contains(&line),
                "line {line} of a text of {lines} lines: {message}"
            );
            assert!(
                message.starts_with(&format!("{file}:{line} (document ")),
                "{message}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        parse_both_ways(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn yaml_ish_text_never_panics(text in "([a-zA-Z]{0,6}(: |:|- |-)?[\\[\\]{},:&*!|>'\"# 0-9.]{0,6}\n?(---\n)?){0,40}") {
        parse_both_ways(&text);
    }

    #[test]
    fn nested_brackets_and_quotes_never_panic(text in "([\\[\\]{}\"'#:, a\n]|\\[\\[\\[\\[){0,600}") {
        parse_both_ways(&text);
    }

    #[test]
    fn nesting_past_the_bound_is_refused_whatever_follows(
        depth in 65usize..2000,
        tail in "[\\]}\"' a,\n]{0,64}",
    ) {
        let text = format!("{}{tail}", "[".repeat(depth));
        for file in ["deep.yaml", "deep.json"] {
            let (objects, errors) = parse_documents(Path::new(file), &text);
            prop_assert!(objects.is_empty());
            prop_assert!(
                errors.iter().any(|e| e.to_string().contains("brackets nest more than 64 levels deep")),
                "{:?}", errors.iter().map(ToString::to_string).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn nesting_hidden_among_quotes_and_apostrophes_is_refused(
        prefix in "a: x[a-z' ]{0,30}\n",
        scalars in prop::collection::vec(
            prop_oneof![
                "[\\[\\]{}\" a#,:]{0,8}".prop_map(|s| format!("'{s}'")),
                "[\\[\\]{}' a#,:]{0,8}".prop_map(|s| format!("\"{s}\"")),
                "[a-z]{1,4}('[a-z]{1,3})?",
            ],
            65..200,
        ),
        line_breaks in any::<bool>(),
    ) {
        // libyaml reads this as one flow sequence per scalar, each inside
        // the previous one: as deep as there are scalars.
        let separator = if line_breaks { ",\n " } else { ", " };
        let nested: String = scalars.iter().map(|s| format!("[ {s}{separator}")).collect();
        let text = format!("{prefix}b: {nested}\n");
        let (objects, errors) = parse_documents(Path::new("deep.yaml"), &text);
        prop_assert!(objects.is_empty());
        prop_assert!(
            errors.iter().any(|e| e.to_string().contains("brackets nest more than 64 levels deep")),
            "{text}\n{:?}", errors.iter().map(ToString::to_string).collect::<Vec<_>>()
        );
    }

    #[test]
    fn damaged_manifests_never_panic(mutations in prop::collection::vec(mutation(), 1..12)) {
        let text = mutations.iter().fold(VALID.to_owned(), |text, m| apply(&text, m));
        parse_both_ways(&text);
    }
}

#[test]
fn the_undamaged_manifest_is_valid() {
    let (objects, errors) = parse_documents(Path::new("fuzz.yaml"), VALID);
    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(errors, Vec::<String>::new());
    assert_eq!(objects.len(), 4);
}

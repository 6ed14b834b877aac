//! The loader and validation never panic: any input gives a configuration or
//! a clear error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kp_config::{load_str, to_yaml, validate, ConfigError, KubeProxyConfiguration};
use proptest::prelude::*;

fn golden() -> String {
    to_yaml(&KubeProxyConfiguration::defaulted()).unwrap()
}

/// Loads `text`; on success validation must run too, and errors must explain themselves.
fn load_and_validate(text: &str) {
    match load_str(text, "fuzz.yaml") {
        Ok((cfg, _warnings)) => {
            if let Err(errors) = validate(&cfg) {
                assert!(!errors.0.is_empty());
                for e in &errors.0 {
                    assert!(!e.field.is_empty() && !e.detail.is_empty(), "{e:?}");
                }
            }
            // Whatever loaded can be written and loaded back.
            let yaml = to_yaml(&cfg).unwrap();
            let (again, _) = load_str(&yaml, "rewritten.yaml").unwrap();
            assert_eq!(to_yaml(&again).unwrap(), yaml);
        }
        Err(err) => {
            let message = err.to_string();
            assert!(
                message.contains("fuzz.yaml"),
                "error does not name the input: {message}"
            );
            assert!(!matches!(err, ConfigError::ReadFile { .. }));
        }
    }
}

/// Edits of one line of a valid file: replace its value, drop it, or duplicate it.
fn mutate(text: &str, line: usize, action: u8, value: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let index = line % lines.len();
    match action % 4 {
        0 => {
            if let Some((key, _)) = lines[index].split_once(':') {
                lines[index] = format!("{key}: {value}");
            }
        }
        1 => {
            lines.remove(index);
        }
        2 => {
            let copy = lines[index].clone();
            lines.insert(index, copy);
        }
        _ => lines[index].push_str(value),
    }
    lines.join("\n")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        load_and_validate(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn mutated_valid_files_never_panic(
        line in 0usize..200,
        action in any::<u8>(),
        value in prop_oneof![
            Just("-1".to_string()), Just("\"\"".to_string()), Just("null".to_string()),
            Just("[a, b]".to_string()), Just("{x: 1}".to_string()), Just("99999999999".to_string()),
            Just("-5m".to_string()), Just("1.5".to_string()), Just("true".to_string()),
            "[ -~]{0,12}",
        ],
    ) {
        load_and_validate(&mutate(&golden(), line, action, &value));
    }
}

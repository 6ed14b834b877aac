//! The two text formats `/metrics` speaks: Prometheus' 0.0.4 text, which
//! upstream serves and every scraper reads, and OpenMetrics 1.0, which the
//! registry encodes, for a scraper that asks for it in `Accept`.

/// A text format of `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpositionFormat {
    /// `text/plain; version=0.0.4`.
    Prometheus,
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
}

impl ExpositionFormat {
    /// OpenMetrics when the scraper's `Accept` header names it, Prometheus'
    /// text otherwise (an absent header included).
    pub fn accepted(accept: &str) -> Self {
        let asks = accept.split(',').any(|range| {
            range.split(';').next().is_some_and(|media| {
                media
                    .trim()
                    .eq_ignore_ascii_case("application/openmetrics-text")
            })
        });
        if asks {
            Self::OpenMetrics
        } else {
            Self::Prometheus
        }
    }

    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// OpenMetrics text as Prometheus' 0.0.4 text: a counter family is named
/// with its `_total` suffix in `# HELP` and `# TYPE` (its samples have it
/// already), `unknown` is `untyped`, and `# UNIT` and `# EOF` go.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // A family's HELP line comes before its TYPE line, which says whether
    // the family's name takes `_total`.
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush_help(&mut out, help.take(), None);
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let name = match kind {
                "counter" if !name.ends_with("_total") => format!("{name}_total"),
                _ => name.to_owned(),
            };
            let kind = if kind == "unknown" { "untyped" } else { kind };
            flush_help(&mut out, help.take(), Some(&name));
            out.push_str("# TYPE ");
            out.push_str(&name);
            out.push(' ');
            out.push_str(kind);
            out.push('\n');
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        } else {
            flush_help(&mut out, help.take(), None);
            out.push_str(line);
            out.push('\n');
        }
    }
    flush_help(&mut out, help, None);
    out
}

/// Writes a held `# HELP` line, under `name` when given.
fn flush_help(out: &mut String, help: Option<(&str, &str)>, name: Option<&str>) {
    if let Some((own, text)) = help {
        out.push_str("# HELP ");
        out.push_str(name.unwrap_or(own));
        out.push(' ');
        out.push_str(text);
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_only_when_the_scraper_names_it() {
        for (accept, format) in [
            ("", ExpositionFormat::Prometheus),
            ("*/*", ExpositionFormat::Prometheus),
            ("text/plain;version=0.0.4", ExpositionFormat::Prometheus),
            (
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                ExpositionFormat::OpenMetrics,
            ),
            ("Application/OpenMetrics-Text", ExpositionFormat::OpenMetrics),
        ] {
            assert_eq!(ExpositionFormat::accepted(accept), format, "{accept:?}");
        }
    }

    #[test]
    fn counters_take_their_total_suffix_and_openmetrics_only_lines_go() {
        let openmetrics = "\
# HELP rest_client_requests Number of HTTP requests.
# TYPE rest_client_requests counter
rest_client_requests_total{code=\"200\"} 3
# HELP process_cpu_seconds Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds counter
# UNIT process_cpu_seconds seconds
process_cpu_seconds_total 1.5
# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds The last time.
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds 17.0
# TYPE odd unknown
odd 1
# EOF
";
        let expected = "\
# HELP rest_client_requests_total Number of HTTP requests.
# TYPE rest_client_requests_total counter
rest_client_requests_total{code=\"200\"} 3
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 1.5
# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds The last time.
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds 17.0
# TYPE odd untyped
odd 1
";
        assert_eq!(to_prometheus_text(openmetrics), expected);
    }
}

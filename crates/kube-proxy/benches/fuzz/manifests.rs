//! Target `manifests`: the manifest parser on random text, damaged
//! manifests and generated clusters with odd values. Every error must name
//! its place, and its object or field.

use std::path::Path;

use kp_source::{parse_documents, ManifestError, ManifestProblem, Severity};

use crate::cluster::Cluster;
use crate::mutate;
use crate::report::{Counts, Failures};
use crate::rng::Gen;

/// One case: an input text, parsed as the file it claims to be.
pub fn case(gen: &mut Gen, counts: &mut Counts, failures: &Failures, case: u64) {
    let (file, text) = input(gen);
    let outcome = std::panic::catch_unwind(|| parse_documents(Path::new(file), &text));
    counts.cases += 1;
    let Ok((_objects, errors)) = outcome else {
        counts.panics += 1;
        failures.report(case, "the parser panicked", &"(see the panic above)", &text);
        return;
    };
    check_errors(&errors, counts, failures, case, &text);
}

/// Counts the input as accepted or rejected and checks each error's message.
pub fn check_errors(
    errors: &[ManifestError],
    counts: &mut Counts,
    failures: &Failures,
    case: u64,
    input: &str,
) {
    if errors.iter().any(|e| e.severity() == Severity::Error) {
        counts.rejected += 1;
    } else {
        counts.accepted += 1;
    }
    for error in errors {
        if std::env::var_os("KP_FUZZ_SHOW_ERRORS").is_some() {
            eprintln!("error: {error}");
        }
        if let Err(why) = names_its_subject(error) {
            counts.unnamed += 1;
            failures.report(case, why, error, input);
        }
    }
}

fn input(gen: &mut Gen) -> (&'static str, String) {
    let file = if gen.chance(0.5) {
        "fuzz.yaml"
    } else {
        "fuzz.json"
    };
    match gen.below(4) {
        0 => (file, mutate::noise(gen)),
        1 => Cluster::random(gen).write(gen),
        _ => {
            let (file, text) = Cluster::random(gen).write(gen);
            (file, mutate::damage(gen, &text, 12))
        }
    }
}

/// Whether the message names what it is about: a place in the file for a
/// text that does not parse, the object (its kind at least) and field for
/// an object that fails a check.
pub fn names_its_subject(error: &ManifestError) -> Result<(), &'static str> {
    let message = error.to_string();
    let location = &error.location;
    if !message.starts_with(&location.path.display().to_string()) {
        return Err("the message does not start with the file");
    }
    let identity = &error.object;
    let field = match &error.problem {
        ManifestProblem::Read(_) | ManifestProblem::NotUtf8 | ManifestProblem::TooLarge { .. } => {
            return Ok(())
        }
        ManifestProblem::Yaml { .. }
        | ManifestProblem::Json(_)
        | ManifestProblem::TooDeep { .. }
        | ManifestProblem::NotAnObject => {
            return match (location.document, location.line) {
                (Some(_), Some(_)) => Ok(()),
                _ => Err("a document that does not parse has no document and line"),
            }
        }
        ManifestProblem::MissingTypeField { field, .. } => format!("{field} is missing"),
        ManifestProblem::UnknownKind { kind } | ManifestProblem::NestedList { kind } => {
            if kind.trim().is_empty() && !message.contains("kind \"") {
                return Err("a blank kind is shown as nothing");
            }
            "kind ".to_owned()
        }
        ManifestProblem::WrongApiVersion { .. } => "apiVersion ".to_owned(),
        ManifestProblem::Decode { path, .. } => {
            if path == "(document)" && identity.kind.is_none() {
                return Err("a decoding error names neither a field nor an object");
            }
            path.clone()
        }
        ManifestProblem::InvalidField { field, .. } | ManifestProblem::Conflict { field, .. } => {
            if identity.kind.is_none() {
                return Err("an invalid field's object has no kind");
            }
            field.clone()
        }
        ManifestProblem::UnknownService { .. } | ManifestProblem::Duplicate { .. } => {
            if identity.name.is_none() {
                return Err("a warning about an object does not name it");
            }
            return Ok(());
        }
    };
    if field.trim().is_empty() || !message.contains(&field) {
        return Err("the message names no field");
    }
    if location.line.is_none() || location.document.is_none() {
        return Err("the message has no document and line");
    }
    Ok(())
}

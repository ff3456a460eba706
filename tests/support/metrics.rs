//! Reading the proxy's `/metrics` exposition (OpenMetrics text): the samples of a metric and
//! their labels, so a scenario can check what a counter says.

use std::collections::BTreeMap;

/// The samples of `metric` in a text exposition: labels and value of each line.
pub fn samples(exposition: &str, metric: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let mut out = Vec::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix(metric) else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{') {
            Some(rest) => rest.split_once("} ").unwrap(),
            None => match rest.strip_prefix(' ') {
                Some(value) => ("", value),
                None => continue,
            },
        };
        let labels = labels
            .split(',')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (name, value) = pair.split_once('=').unwrap();
                (name.to_owned(), value.trim_matches('"').to_owned())
            })
            .collect();
        let value = value.split_whitespace().next().unwrap().parse().unwrap();
        out.push((labels, value));
    }
    out
}

/// The sum of the samples of `metric` whose labels include all of `want`.
pub fn total(exposition: &str, metric: &str, want: &[(&str, &str)]) -> f64 {
    samples(exposition, metric)
        .into_iter()
        .filter(|(labels, _)| {
            want.iter()
                .all(|(name, value)| labels.get(*name).map(String::as_str) == Some(*value))
        })
        .map(|(_, value)| value)
        .sum()
}

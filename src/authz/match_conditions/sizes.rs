//! The sizes of `request` for the cost model ([`crate::base::cel::cost`]): the largest review
//! the proxy can build, priced at load, and the review at hand, priced before a condition whose
//! worst case could pass the per-call limit is evaluated.

use std::sync::{Arc, LazyLock};

use k8s_openapi::api::authorization::v1::SubjectAccessReviewSpec;

use super::REQUEST;
use crate::apiserver::MAX_RESPONSE_BYTES;
use crate::base::cel::{Size, Sizes};
use crate::base::wire::MAX_PATH_LEN;

/// The fewest bytes one element of a JSON list of strings takes (`"",`): the most elements a
/// TokenReview answer's list can have is its size over this.
const MIN_LIST_ELEMENT_BYTES: usize = 3;
/// The fewest bytes one entry of a JSON map of string lists takes (`"":[],`).
const MIN_MAP_ENTRY_BYTES: usize = 6;

/// The largest review the proxy can build: the user (name, uid, groups, extra) comes from a
/// TokenReview answer, which the proxy reads up to [`MAX_RESPONSE_BYTES`], or from a client
/// certificate, which TLS bounds to far less; the resource attributes come from the request
/// path, at most [`MAX_PATH_LEN`] bytes. Built once.
pub(super) fn worst_case() -> &'static Sizes {
    static WORST_CASE: LazyLock<Sizes> = LazyLock::new(|| {
        let bytes = MAX_RESPONSE_BYTES;
        let strings = || Size::list_of_strings(bytes / MIN_LIST_ELEMENT_BYTES, bytes, bytes);
        let extra = Size::Map {
            count: (bytes / MIN_MAP_ENTRY_BYTES) as f64,
            key: Box::new(Size::Str(bytes as f64)),
            key_total: Some(bytes as f64),
            value: Box::new(strings()),
        };
        let request = request(
            Size::Str(bytes as f64),
            Size::Str(bytes as f64),
            strings(),
            extra,
            MAX_PATH_LEN,
            MAX_PATH_LEN,
        );
        Sizes::new(vec![(REQUEST, request)], bytes as f64)
    });
    &WORST_CASE
}

/// The sizes of `spec`'s parts.
pub(super) fn of(spec: &SubjectAccessReviewSpec) -> Sizes {
    fn len(value: &Option<String>) -> usize {
        value.as_deref().map_or(0, str::len)
    }
    fn strings<'s>(values: impl Iterator<Item = &'s String> + Clone) -> Size {
        let longest = values.clone().map(String::len).max().unwrap_or(0);
        let total = values.clone().map(String::len).sum();
        Size::list_of_strings(values.count(), longest, total)
    }
    let groups = spec.groups.as_deref().unwrap_or_default();
    let extra = spec.extra.as_ref();
    let entries = || extra.into_iter().flatten();
    let values = entries().map(|(_, values)| strings(values.iter()));
    let value = values.fold(Size::list_of_strings(0, 0, 0), Size::max);
    let resource = spec.resource_attributes.as_ref().map_or(0, |a| {
        [
            &a.namespace,
            &a.verb,
            &a.group,
            &a.version,
            &a.resource,
            &a.subresource,
            &a.name,
        ]
        .into_iter()
        .map(len)
        .max()
        .unwrap_or(0)
    });
    let non_resource = spec
        .non_resource_attributes
        .as_ref()
        .map_or(0, |a| len(&a.path).max(len(&a.verb)));
    let key_total: usize = entries().map(|(key, _)| key.len()).sum();
    let value_total: usize = entries().flat_map(|(_, v)| v).map(String::len).sum();
    let group_total: usize = groups.iter().map(String::len).sum();
    let ceiling = len(&spec.user)
        + len(&spec.uid)
        + group_total
        + groups.len()
        + key_total
        + value_total
        + resource
        + non_resource;
    let extra = Size::Map {
        count: entries().count() as f64,
        key: Box::new(Size::Str(
            entries().map(|(key, _)| key.len()).max().unwrap_or(0) as f64,
        )),
        key_total: Some(key_total as f64),
        value: Box::new(value),
    };
    let request = request(
        Size::Str(len(&spec.user) as f64),
        Size::Str(len(&spec.uid) as f64),
        strings(groups.iter()),
        extra,
        resource,
        non_resource,
    );
    Sizes::new(vec![(REQUEST, request)], ceiling as f64)
}

/// `request` as a record of its fields' sizes: the user's, and the resource and non-resource
/// attributes' strings each at most `resource` and `non_resource` bytes.
fn request(
    user: Size,
    uid: Size,
    groups: Size,
    extra: Size,
    resource: usize,
    non_resource: usize,
) -> Size {
    let resource = Size::Str(resource as f64);
    let non_resource = Size::Str(non_resource as f64);
    let selector = Size::Record(Arc::from([("rawSelector", resource.clone())]));
    let resource_attributes = Size::Record(Arc::from([
        ("namespace", resource.clone()),
        ("verb", resource.clone()),
        ("group", resource.clone()),
        ("version", resource.clone()),
        ("resource", resource.clone()),
        ("subresource", resource.clone()),
        ("name", resource),
        ("fieldSelector", selector.clone()),
        ("labelSelector", selector),
    ]));
    let non_resource_attributes = Size::Record(Arc::from([
        ("path", non_resource.clone()),
        ("verb", non_resource),
    ]));
    Size::Record(Arc::from([
        ("user", user),
        ("uid", uid),
        ("groups", groups),
        ("extra", extra),
        ("resourceAttributes", resource_attributes),
        ("nonResourceAttributes", non_resource_attributes),
    ]))
}

#[cfg(test)]
mod tests;

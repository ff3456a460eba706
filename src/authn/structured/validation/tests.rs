//! Each of kube-apiserver's rules, with its field path and wording.

use super::*;

const SA_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

fn check(jwt: &str) -> Result<Validated, String> {
    check_file(&format!("jwt:\n{jwt}"), &Context::default())
}

fn check_file(body: &str, context: &Context) -> Result<Validated, String> {
    let text = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthenticationConfiguration\n{body}"
    );
    let config = file::decode(&text).map_err(|e| e.to_string())?;
    validate(&config, context).map_err(|e| e.to_string())
}

/// One authenticator with the given issuer fields and claim mappings.
fn authenticator(issuer: &str, mappings: &str) -> String {
    format!("- issuer: {{{issuer}}}\n  claimMappings: {{{mappings}}}\n")
}

const GOOD_ISSUER: &str = "url: 'https://issuer.example', audiences: [kubelet]";
const GOOD_MAPPINGS: &str = "username: {claim: sub, prefix: 'oidc:'}";

#[test]
fn a_complete_authenticator_passes() {
    let validated = check(&authenticator(GOOD_ISSUER, GOOD_MAPPINGS)).unwrap();
    assert_eq!(validated.jwt.len(), 1);
    assert_eq!(validated.jwt[0].source.url, "https://issuer.example");
    assert_eq!(validated.jwt[0].audiences, ["kubelet"]);
    assert!(validated.anonymous.is_none());
}

#[test]
fn issuer_urls_are_https_without_user_query_or_fragment() {
    let refused = |url: &str| {
        check(&authenticator(
            &format!("url: '{url}', audiences: [a]"),
            GOOD_MAPPINGS,
        ))
        .unwrap_err()
    };
    assert_eq!(
        refused("http://issuer.example"),
        "jwt[0].issuer.url: Invalid value: \"http://issuer.example\": URL scheme must be https"
    );
    assert_eq!(
        refused("https://u:p@issuer.example"),
        "jwt[0].issuer.url: Invalid value: \"https://u:p@issuer.example\": URL must not contain a username or password"
    );
    assert_eq!(
        refused("https://issuer.example?x=1#f"),
        "[jwt[0].issuer.url: Invalid value: \"https://issuer.example?x=1#f\": URL must not contain a query, \
         jwt[0].issuer.url: Invalid value: \"https://issuer.example?x=1#f\": URL must not contain a fragment]"
    );
    assert_eq!(
        check(&authenticator("audiences: [a]", GOOD_MAPPINGS)).unwrap_err(),
        "jwt[0].issuer.url: Required value"
    );
}

#[test]
fn the_service_account_issuer_is_not_a_jwt_issuer() {
    let context = Context {
        service_account_issuers: vec![SA_ISSUER.to_owned()],
        anonymous_flag: false,
    };
    let body = format!(
        "jwt:\n{}",
        authenticator(
            &format!("url: '{SA_ISSUER}', audiences: [a]"),
            GOOD_MAPPINGS
        )
    );
    assert_eq!(
        check_file(&body, &context).unwrap_err(),
        format!(
            "jwt[0].issuer.url: Invalid value: \"{SA_ISSUER}\": URL must not overlap with \
             disallowed issuers: [{SA_ISSUER}]"
        )
    );
}

#[test]
fn issuers_and_discovery_urls_are_unique() {
    let discovery =
        "url: 'https://issuer.example', discoveryURL: 'https://d.example/o', audiences: [a]";
    let two = format!(
        "{}{}",
        authenticator(discovery, GOOD_MAPPINGS),
        authenticator(discovery, GOOD_MAPPINGS)
    );
    assert_eq!(
        check(&two).unwrap_err(),
        "[jwt[1].issuer.url: Duplicate value: \"https://issuer.example\", \
         jwt[1].issuer.discoveryURL: Duplicate value: \"https://d.example/o\"]"
    );
    let same =
        "url: 'https://issuer.example', discoveryURL: 'https://issuer.example/', audiences: [a]";
    assert_eq!(
        check(&authenticator(same, GOOD_MAPPINGS)).unwrap_err(),
        "jwt[0].issuer.discoveryURL: Invalid value: \"https://issuer.example/\": discoveryURL must be different from URL"
    );
}

#[test]
fn audiences_and_their_match_policy() {
    let issuer = |rest: &str| format!("url: 'https://issuer.example', {rest}");
    assert_eq!(
        check(&authenticator(&issuer("audiences: []"), GOOD_MAPPINGS)).unwrap_err(),
        "jwt[0].issuer.audiences: Required value: at least one jwt[0].issuer.audiences is required"
    );
    assert_eq!(
        check(&authenticator(&issuer("audiences: [a, b]"), GOOD_MAPPINGS)).unwrap_err(),
        "jwt[0].issuer.audienceMatchPolicy: Invalid value: \"\": audienceMatchPolicy must be MatchAny for multiple audiences"
    );
    check(&authenticator(
        &issuer("audiences: [a, b], audienceMatchPolicy: MatchAny"),
        GOOD_MAPPINGS,
    ))
    .unwrap();
    assert_eq!(
        check(&authenticator(
            &issuer("audiences: [a, a, ''], audienceMatchPolicy: MatchAny"),
            GOOD_MAPPINGS
        ))
        .unwrap_err(),
        "[jwt[0].issuer.audiences[1]: Duplicate value: \"a\", jwt[0].issuer.audiences[2]: Required value]"
    );
    assert_eq!(
        check(&authenticator(
            &issuer("audiences: [a], audienceMatchPolicy: MatchAll"),
            GOOD_MAPPINGS
        ))
        .unwrap_err(),
        "jwt[0].issuer.audienceMatchPolicy: Invalid value: \"MatchAll\": audienceMatchPolicy must be empty or MatchAny for single audience"
    );
}

#[test]
fn a_certificate_authority_must_hold_certificates() {
    let issuer = "url: 'https://issuer.example', audiences: [a], certificateAuthority: 'not PEM'";
    assert_eq!(
        check(&authenticator(issuer, GOOD_MAPPINGS)).unwrap_err(),
        "jwt[0].issuer.certificateAuthority: Invalid value: \"<omitted>\": data does not contain any valid RSA or ECDSA certificates"
    );
    let egress = "url: 'https://issuer.example', audiences: [a], egressSelectorType: etcd";
    assert_eq!(
        check(&authenticator(egress, GOOD_MAPPINGS)).unwrap_err(),
        "jwt[0].issuer.egressSelectorType: Invalid value: \"etcd\": egress selector must be either controlplane or cluster"
    );
}

#[test]
fn claim_mappings_take_a_claim_with_a_prefix_or_an_expression() {
    let refused = |mappings: &str| check(&authenticator(GOOD_ISSUER, mappings)).unwrap_err();
    assert_eq!(
        refused("groups: {claim: g, prefix: ''}"),
        "jwt[0].claimMappings.username: Required value: claim or expression is required"
    );
    assert_eq!(
        refused("username: {claim: sub}"),
        "jwt[0].claimMappings.username.prefix: Required value: prefix is required when claim is \
         set. It can be set to an empty string to disable prefixing"
    );
    assert_eq!(
        refused("username: {claim: sub, expression: claims.sub, prefix: ''}"),
        "jwt[0].claimMappings.username: Invalid value: \"\": claim and expression can't both be set"
    );
    assert_eq!(
        refused("username: {expression: claims.sub, prefix: 'x:'}"),
        "jwt[0].claimMappings.username.prefix: Invalid value: \"x:\": may not be specified when expression is set"
    );
    assert_eq!(
        refused("username: {claim: sub, prefix: ''}, uid: {claim: sub, expression: claims.sub}"),
        "jwt[0].claimMappings.uid: Invalid value: \"\": claim and expression can't both be set"
    );
    assert_eq!(
        refused("username: {claim: sub, prefix: ''}, groups: {claim: g}"),
        "jwt[0].claimMappings.groups.prefix: Required value: prefix is required when claim is set. \
         It can be set to an empty string to disable prefixing"
    );
}

#[test]
fn extra_keys_are_lowercase_domain_prefixed_and_not_kubernetes_own() {
    let refused = |key: &str| {
        check(&authenticator(
            GOOD_ISSUER,
            &format!("{GOOD_MAPPINGS}, extra: [{{key: '{key}', valueExpression: claims.x}}]"),
        ))
        .unwrap_err()
    };
    assert_eq!(
        refused("tenant"),
        "jwt[0].claimMappings.extra[0].key: Invalid value: \"tenant\": must be a domain-prefixed path (such as \"acme.io/foo\")"
    );
    assert_eq!(
        refused("Example.com/Tenant"),
        "[jwt[0].claimMappings.extra[0].key: Invalid value: \"Example.com\": a lowercase RFC 1123 \
         subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start \
         and end with an alphanumeric character (e.g. 'example.com', regex used for validation is \
         '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*'), \
         jwt[0].claimMappings.extra[0].key: Invalid value: \"Example.com/Tenant\": must be lowercase]"
    );
    assert_eq!(
        refused("authentication.kubernetes.io/x"),
        "jwt[0].claimMappings.extra[0].key: Invalid value: \"authentication.kubernetes.io/x\": \
         k8s.io, kubernetes.io and their subdomains are reserved for Kubernetes use"
    );
    let twice = check(&authenticator(
        GOOD_ISSUER,
        &format!(
            "{GOOD_MAPPINGS}, extra: [{{key: a.io/x, valueExpression: claims.x}}, \
             {{key: a.io/x, valueExpression: claims.y}}, {{key: a.io/y}}]"
        ),
    ))
    .unwrap_err();
    assert_eq!(
        twice,
        "[jwt[0].claimMappings.extra[1].key: Duplicate value: \"a.io/x\", \
         jwt[0].claimMappings.extra[2].valueExpression: Required value]"
    );
}

#[test]
fn claim_validation_rules_take_a_claim_or_an_expression() {
    let rules = |rules: &str| {
        check(&format!(
            "{}  claimValidationRules: {rules}\n",
            authenticator(GOOD_ISSUER, GOOD_MAPPINGS)
        ))
    };
    assert_eq!(
        rules("[{claim: hd, requiredValue: example.com, message: m}]").unwrap_err(),
        "jwt[0].claimValidationRules[0].message: Invalid value: \"m\": may not be specified when claim is set"
    );
    assert_eq!(
        rules("[{claim: hd, expression: 'claims.hd == \"x\"'}]").unwrap_err(),
        "jwt[0].claimValidationRules[0]: Invalid value: \"hd\": claim and expression can't both be set"
    );
    assert_eq!(
        rules("[{message: m}]").unwrap_err(),
        "jwt[0].claimValidationRules[0]: Required value: claim or expression is required"
    );
    assert_eq!(
        rules("[{claim: hd, requiredValue: a}, {claim: hd, requiredValue: b}]").unwrap_err(),
        "jwt[0].claimValidationRules[1].claim: Duplicate value: \"hd\""
    );
    assert_eq!(
        rules("[{expression: 'claims.a == 1', requiredValue: b}]").unwrap_err(),
        "jwt[0].claimValidationRules[0].requiredValue: Invalid value: \"b\": may not be specified when expression is set"
    );
    let validated = rules("[{claim: hd, requiredValue: example.com}]").unwrap();
    assert_eq!(
        validated.jwt[0].mapper.required_claims,
        [("hd".to_owned(), "example.com".to_owned())]
    );
}

#[test]
fn user_validation_rules_need_distinct_expressions() {
    let rules = |rules: &str| {
        check(&format!(
            "{}  userValidationRules: {rules}\n",
            authenticator(GOOD_ISSUER, GOOD_MAPPINGS)
        ))
    };
    assert_eq!(
        rules("[{message: m}]").unwrap_err(),
        "jwt[0].userValidationRules[0].expression: Required value"
    );
    assert_eq!(
        rules("[{expression: 'user.uid != \"\"'}, {expression: 'user.uid != \"\"'}]").unwrap_err(),
        "jwt[0].userValidationRules[1].expression: Duplicate value: \"user.uid != \\\"\\\"\""
    );
}

#[test]
fn anonymous_conditions_need_it_enabled_and_exclude_the_flag() {
    let context = Context::default();
    let rule = |body: &str| check_file(body, &context).map(|v| v.anonymous);
    assert_eq!(
        rule("anonymous: {enabled: true, conditions: [{path: /healthz}]}").unwrap(),
        Some(AnonymousRule::Paths(["/healthz".to_owned()].into()))
    );
    assert_eq!(
        rule("anonymous: {enabled: true}").unwrap(),
        Some(AnonymousRule::Everywhere)
    );
    assert_eq!(
        rule("anonymous: {enabled: false}").unwrap(),
        Some(AnonymousRule::Disabled)
    );
    assert_eq!(
        rule("anonymous: {enabled: false, conditions: [{path: /healthz}]}").unwrap_err(),
        "anonymous.conditions: Invalid value: [\"/healthz\"]: enabled should be set to true when conditions are defined"
    );
    let flag = Context {
        anonymous_flag: true,
        ..Context::default()
    };
    assert!(
        check_file("anonymous: {enabled: true}", &flag)
            .unwrap_err()
            .starts_with("anonymous: Forbidden: --anonymous-auth cannot be set")
    );
    // No authenticator at all is allowed, as kube-apiserver allows it.
    assert!(check_file("", &context).unwrap().jwt.is_empty());
}

#[test]
fn at_most_64_authenticators() {
    let many: String = (0..65)
        .map(|i| {
            authenticator(
                &format!("url: 'https://i{i}.example', audiences: [a]"),
                GOOD_MAPPINGS,
            )
        })
        .collect();
    assert_eq!(
        check(&many).unwrap_err(),
        "jwt: Too many: 65: must have at most 64 items"
    );
}

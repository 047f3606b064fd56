//! deploy/ is tested, not just written: every Kubernetes manifest passes kubernetes-validate
//! (strict, pinned Kubernetes version), each kustomization lists exactly its directory's
//! manifests, the limits inside the ConfigMaps pass `tollgate check` (extracted here, not
//! copied), the sidecar's Envoy config passes `envoy --mode validate`, the Dockerfile passes
//! hadolint, and the release workflow is a valid GitHub workflow. The tools come from .venv
//! (scripts/test installs them).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::tollgate_bin;
use serde_json::Value;

/// The Kubernetes version the manifests are validated against.
const KUBERNETES: &str = "1.33.0";

fn tool(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".venv/bin")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/test, which installs the pinned tools into .venv",
        path.display()
    );
    path
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(yaml_files(&path));
        } else if path.extension().is_some_and(|e| e == "yaml") {
            files.push(path);
        }
    }
    files.sort();
    files
}

fn manifests() -> Vec<PathBuf> {
    yaml_files(Path::new("deploy/k8s"))
        .into_iter()
        // A patch (`patch-*.yaml`) is part of a manifest, validated as rendered.
        .filter(|path| {
            path.file_name().is_some_and(|n| {
                n != "kustomization.yaml" && !n.to_string_lossy().starts_with("patch-")
            })
        })
        .collect()
}

fn parse(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn run(command: &mut Command) -> std::process::Output {
    let output = command.output().expect("run tool");
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

#[test]
fn every_manifest_passes_kubernetes_validate() {
    let files = manifests();
    assert_eq!(files.len(), 15, "{files:?}");
    run(Command::new(tool("kubernetes-validate"))
        .args(["--kubernetes-version", KUBERNETES, "--strict", "--quiet"])
        .args(&files));
}

/// What `kubectl kustomize` renders for each kustomization passes kubernetes-validate too
/// (the Prometheus Operator's kinds have no schema there: promtool checks their rules).
#[test]
fn every_kustomization_renders_and_what_it_renders_validates() {
    let dir = tempfile::tempdir().unwrap();
    for name in KUSTOMIZATIONS {
        let rendered = run(Command::new("kubectl")
            .args(["kustomize"])
            .arg(Path::new("deploy/k8s").join(name)));
        // Nothing deprecated (kustomize warns on stderr, e.g. for patchesStrategicMerge).
        assert_eq!(String::from_utf8_lossy(&rendered.stderr), "", "{name}");
        let file = dir.path().join(format!("{}.yaml", name.replace('/', "-")));
        std::fs::write(&file, &rendered.stdout).unwrap();
        let text = String::from_utf8_lossy(&rendered.stdout).into_owned();
        // The image comes from the one `images:` entry, never the placeholder.
        for line in text
            .lines()
            .filter(|line| line.trim_start().starts_with("image:"))
        {
            assert!(
                !line.trim_end().ends_with("image: tollgate"),
                "{name}: {line}"
            );
        }
        run(Command::new(tool("kubernetes-validate"))
            .args(["--kubernetes-version", KUBERNETES, "--strict", "--quiet"])
            .arg(&file));
    }
    let try_it = std::fs::read_to_string(dir.path().join("overlays-try-it.yaml")).unwrap();
    assert!(
        try_it.contains("value: redis://redis:6379"),
        "the overlay's own Redis"
    );
    assert!(try_it.contains("kind: StatefulSet"));
    assert!(
        try_it.contains("image: tollgate:try-it"),
        "the image docs/kind.md loads"
    );
}

const KUSTOMIZATIONS: [&str; 4] = ["base", "overlays/try-it", "sidecar", "monitoring"];

/// The resources `kubectl kustomize` renders for one kustomization.
fn render(name: &str) -> Vec<Value> {
    let rendered = run(Command::new("kubectl")
        .args(["kustomize"])
        .arg(Path::new("deploy/k8s").join(name)));
    let text = String::from_utf8(rendered.stdout).unwrap();
    text.split("\n---\n")
        .map(|document| serde_saphyr::from_str(document).unwrap())
        .collect()
}

fn find<'a>(resources: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    resources
        .iter()
        .find(|r| r["kind"] == kind && r["metadata"]["name"] == name)
}

#[test]
fn the_autoscaler_alone_owns_the_replica_count_and_try_it_runs_one_pod() {
    // Wherever an autoscaler scales the Deployment, the Deployment names no count: an apply
    // would reset the autoscaler's.
    for name in KUSTOMIZATIONS {
        let resources = render(name);
        for autoscaler in resources
            .iter()
            .filter(|r| r["kind"] == "HorizontalPodAutoscaler")
        {
            let target = &autoscaler["spec"]["scaleTargetRef"];
            let deployment = find(&resources, "Deployment", target["name"].as_str().unwrap())
                .unwrap_or_else(|| panic!("{name}: the autoscaler's target is not rendered"));
            assert_eq!(deployment["spec"]["replicas"], Value::Null, "{name}");
        }
    }
    assert!(find(&render("base"), "HorizontalPodAutoscaler", "tollgate").is_some());

    let try_it = render("overlays/try-it");
    assert_eq!(find(&try_it, "HorizontalPodAutoscaler", "tollgate"), None);
    assert_eq!(find(&try_it, "PodDisruptionBudget", "tollgate"), None);
    let deployment = find(&try_it, "Deployment", "tollgate").unwrap();
    assert_eq!(deployment["spec"]["replicas"], 1);
}

/// The volume a container mounts at the directory of `file`, and the file's name in it.
fn mounted<'a>(pod: &'a Value, container: &Value, file: &str) -> (&'a Value, String) {
    let (dir, name) = file.rsplit_once('/').unwrap();
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == dir)
        .unwrap_or_else(|| panic!("nothing mounted at {dir}"));
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    (volume, name.to_owned())
}

fn env<'a>(container: &'a Value, name: &str) -> &'a Value {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no {name}"))
}

#[test]
fn the_redis_password_reaches_tollgate_from_a_secret() {
    // (overlay, the Secret's name, whether the overlay generates it)
    for (name, secret, generated) in [
        ("base", "redis-cluster", false),
        ("overlays/try-it", "redis-", true),
    ] {
        let resources = render(name);
        let pod = &find(&resources, "Deployment", "tollgate").unwrap()["spec"]["template"]["spec"];
        let tollgate = &pod["containers"][0];
        let file = env(tollgate, "TOLLGATE_REDIS_PASSWORD_FILE")["value"]
            .as_str()
            .unwrap();
        let (volume, file_name) = mounted(pod, tollgate, file);
        let secret_name = volume["secret"]["secretName"].as_str().unwrap();
        assert!(secret_name.starts_with(secret), "{name}: {secret_name}");
        let item = &volume["secret"]["items"][0];
        assert_eq!(
            (item["key"].as_str(), item["path"].as_str()),
            (Some("redis-password"), Some(file_name.as_str())),
            "{name}"
        );
        if generated {
            // The overlay's Redis requires the very same Secret's password.
            let secret = find(&resources, "Secret", secret_name).unwrap();
            assert_eq!(secret["data"]["redis-password"], "dHJ5LWl0LW9ubHk=");
            let redis = &find(&resources, "StatefulSet", "redis").unwrap()["spec"]["template"]["spec"]
                ["containers"][0];
            assert_eq!(
                env(redis, "REDIS_PASSWORD")["valueFrom"]["secretKeyRef"]["name"],
                secret_name
            );
            let args = redis["args"].as_array().unwrap();
            assert!(
                args.windows(2)
                    .any(|pair| pair[0] == "--requirepass" && pair[1] == "$(REDIS_PASSWORD)")
            );
        }
    }
}

#[test]
fn replicas_spread_over_nodes_and_services_take_both_ip_families() {
    let resources = render("base");
    let pod = &find(&resources, "Deployment", "tollgate").unwrap()["spec"]["template"]["spec"];
    let keys: Vec<&str> = pod["topologySpreadConstraints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["topologyKey"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
    );
    for service in resources.iter().filter(|r| r["kind"] == "Service") {
        assert_eq!(service["spec"]["ipFamilyPolicy"], "PreferDualStack");
    }
}

#[test]
fn the_monitoring_objects_carry_the_release_label_set_in_one_place() {
    let resources = render("monitoring");
    assert_eq!(resources.len(), 2);
    for resource in &resources {
        assert_eq!(
            resource["metadata"]["labels"]["release"], "kube-prometheus-stack",
            "{}",
            resource["kind"]
        );
    }
    // Set in the kustomization only, not in each object.
    for file in ["servicemonitor.yaml", "prometheusrule.yaml"] {
        let text = std::fs::read_to_string(Path::new("deploy/k8s/monitoring").join(file)).unwrap();
        assert!(!text.contains("release:"), "{file}");
    }
}

#[test]
fn the_prometheus_rule_carries_the_alerts_promtool_checks() {
    let rule = parse(Path::new("deploy/k8s/monitoring/prometheusrule.yaml"));
    let alerts = parse(Path::new("deploy/prometheus/alerts.yaml"));
    assert_eq!(rule["spec"]["groups"], alerts["groups"]);
}

#[test]
fn each_kustomization_lists_exactly_the_manifests_beside_it_one_kind_per_file() {
    for kustomization in yaml_files(Path::new("deploy/k8s"))
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "kustomization.yaml"))
    {
        let dir = kustomization.parent().unwrap();
        let kustomization_yaml = parse(&kustomization);
        // Other kustomizations (`../../base`) are not files beside it; patches are.
        assert_eq!(
            kustomization_yaml["patchesStrategicMerge"],
            Value::Null,
            "deprecated"
        );
        let patches: Vec<Value> = kustomization_yaml["patches"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|patch| patch["path"].clone())
            .collect();
        let mut listed: Vec<String> = kustomization_yaml["resources"]
            .as_array()
            .unwrap()
            .iter()
            .chain(&patches)
            .map(|r| r.as_str().unwrap().to_owned())
            .filter(|r| !r.contains('/'))
            .collect();
        listed.sort();
        let mut present: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n != "kustomization.yaml"))
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        present.sort();
        assert_eq!(listed, present, "{}", kustomization.display());
    }
    for manifest in manifests() {
        let text = std::fs::read_to_string(&manifest).unwrap();
        assert_eq!(
            text.matches("\nkind: ").count(),
            1,
            "{}",
            manifest.display()
        );
    }
}

#[test]
fn limits_in_the_configmaps_pass_tollgate_check() {
    let mut checked = 0;
    for manifest in manifests() {
        let resource = parse(&manifest);
        if resource["kind"] != "ConfigMap"
            || resource["metadata"]["labels"]["app.kubernetes.io/component"] != "limits"
        {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in resource["data"].as_object().unwrap() {
            std::fs::write(dir.path().join(name), text.as_str().unwrap()).unwrap();
        }
        let output = run(tollgate_bin().arg("check").arg(dir.path()));
        assert!(String::from_utf8_lossy(&output.stdout).contains("ok, 1 domain(s)"));
        checked += 1;
    }
    assert_eq!(checked, 2, "the service's and the sidecar's limits");
    run(tollgate_bin().args(["check", "deploy/config"]));
}

#[test]
fn the_service_configmap_carries_the_limits_the_envoy_tests_use() {
    let configmap = parse(Path::new("deploy/k8s/base/configmap.yaml"));
    let inside: Value =
        serde_saphyr::from_str(configmap["data"]["edge.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(inside, parse(Path::new("deploy/config/edge.yaml")));
}

#[test]
fn the_sidecar_envoy_config_passes_envoy_validate() {
    let configmap = parse(Path::new("deploy/k8s/sidecar/configmap-envoy.yaml"));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("envoy.yaml");
    std::fs::write(&config, configmap["data"]["envoy.yaml"].as_str().unwrap()).unwrap();
    run(Command::new(tool("envoy"))
        .args(["--mode", "validate", "--use-dynamic-base-id", "-c"])
        .arg(&config));
    run(Command::new(tool("envoy")).args([
        "--mode",
        "validate",
        "--use-dynamic-base-id",
        "-c",
        "deploy/envoy/envoy.yaml",
    ]));
}

#[test]
fn the_release_workflow_is_a_valid_github_workflow() {
    // actionlint's PyPI package fetches its binary from GitHub when installed; the schema
    // check needs no network once installed.
    run(Command::new(tool("check-jsonschema")).args([
        "--builtin-schema",
        "vendor.github-workflows",
        ".github/workflows/release.yml",
    ]));
    let workflow = std::fs::read_to_string(".github/workflows/release.yml").unwrap();
    // The image is the Dockerfile's, for both architectures, on a version tag.
    for part in [
        "tags: [\"v*\"]",
        "file: deploy/docker/Dockerfile",
        "platforms: linux/amd64,linux/arm64",
        "cargo build --release --locked --bin tollgate",
    ] {
        assert!(workflow.contains(part), "{part}");
    }
}

#[test]
fn the_dockerfile_passes_hadolint() {
    run(Command::new(tool("hadolint")).arg("deploy/docker/Dockerfile"));
}

#[test]
fn tollgate_containers_log_json_and_probe_readiness_over_plain_http() {
    for path in [
        "deploy/k8s/base/deployment.yaml",
        "deploy/k8s/sidecar/deployment.yaml",
    ] {
        let manifest = parse(Path::new(path));
        let containers = manifest["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap();
        let tollgate = containers
            .iter()
            .find(|c| c["name"] == "tollgate")
            .unwrap_or_else(|| panic!("{path}: no tollgate container"));
        let env = tollgate["env"].as_array().unwrap();
        assert!(
            env.iter()
                .any(|v| v["name"] == "TOLLGATE_LOG_FORMAT" && v["value"] == "json"),
            "{path}: logs are not JSON"
        );
        // The kubelet's gRPC probe cannot speak TLS; /readyz works whatever the listener's.
        assert_eq!(
            tollgate["readinessProbe"]["httpGet"]["path"], "/readyz",
            "{path}"
        );
    }
}

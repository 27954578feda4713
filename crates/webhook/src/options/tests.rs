//! `WebhookOptions`: flags, checks and what they configure.

use super::*;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    webhook: WebhookOptions,
}

#[test]
fn flags_have_defaults_and_parse() {
    use clap::CommandFactory as _;
    Cli::command().debug_assert();
    let o = Cli::try_parse_from(["memprof-operator"]).unwrap().webhook;
    assert_eq!(o.port, 8443);
    assert_eq!(o.cert_mode, CertMode::SelfSigned);
    let cfg = o.injection_config(false);
    assert_eq!(cfg, InjectionConfig::default());
    assert_eq!(o.cert_config(), CertConfig::default());

    // As the Helm chart passes them.
    let o = Cli::try_parse_from([
        "memprof-operator",
        "--webhook-cert-mode=files",
        "--gpu-access=podResources",
        "--sidecar-interval=250ms",
        "--sidecar-cpu-limit=",
        "--sidecar-memory-limit=",
        "--sidecar-mode=legacy",
        "--webhook-extra-names=127.0.0.1,localhost",
        "--default-thresholds={\"highTtoSeconds\":900}",
        "--sidecar-log-json=true",
        "--sidecar-security-context={\"runAsUser\":1000}",
    ])
    .unwrap()
    .webhook;
    assert_eq!(o.cert_mode, CertMode::Files);
    let cfg = o.injection_config(o.sidecar_mode.resolve("1", "31"));
    assert_eq!(cfg.gpu_access, GpuAccess::PodResources);
    assert_eq!(cfg.interval, Duration::from_millis(250));
    assert_eq!((cfg.cpu_limit, cfg.memory_limit), (None, None));
    assert!(!cfg.native_sidecar);
    assert_eq!(o.cert_config().extra_names, ["127.0.0.1", "localhost"]);
    assert!(!cfg.allow_image_override && cfg.allowed_images.is_empty());
    assert!(Cli::try_parse_from(["x", "--sidecar-interval=fast"]).is_err());
    assert!(Cli::try_parse_from(["x", "--gpu-access=all"]).is_err());
    assert_eq!(cfg.thresholds["highTtoSeconds"], 900);
    assert!(cfg.log_json);
    let sc = cfg.security_context.unwrap();
    assert_eq!(sc.run_as_user, Some(1000));
    assert!(Cli::try_parse_from(["x", "--default-thresholds={\"highTtoSeconds\":1}"]).is_err());
    let Err(err) = Cli::try_parse_from(["x", "--sidecar-security-context=root"]) else {
        panic!("a securityContext that is not JSON is refused");
    };
    assert!(
        err.to_string().contains(
            "not a JSON securityContext (expected value at line 1 column 1); see `kubectl explain"
        ),
        "{err}"
    );
    let empty = Cli::try_parse_from(["x", "--default-thresholds=", "--sidecar-security-context="])
        .unwrap()
        .webhook
        .injection_config(true);
    assert!(empty.thresholds.is_empty() && empty.security_context.is_none());
}

#[test]
fn the_webhook_is_refused_without_a_sidecar_image_naming_the_flag() {
    let opts = |args: &[&str]| {
        let argv = ["memprof-operator"].iter().chain(args).copied();
        Cli::try_parse_from(argv).unwrap().webhook
    };
    let err = opts(&[]).check().unwrap_err().to_string();
    assert!(
        err.contains("--sidecar-image (MEMPROF_SIDECAR_IMAGE)"),
        "{err}"
    );
    assert!(!err.contains("  "), "one line, no runs of spaces: {err}");
    assert!(opts(&["--sidecar-image= "]).check().is_err());
    assert!(opts(&["--sidecar-image=registry.example.com/memprof:1"])
        .check()
        .is_ok());
    // Without the webhook no image is needed.
    assert!(opts(&["--webhook-port=0"]).check().is_ok());
}

#[test]
fn sidecar_image_overrides_are_off_unless_allowed_with_a_list() {
    let cfg = |args: &[&str]| {
        let argv = ["memprof-operator"].iter().chain(args).copied();
        Cli::try_parse_from(argv)
            .map(|c| c.webhook.injection_config(true))
            .map_err(|e| e.to_string())
    };
    let off = cfg(&[]).unwrap();
    assert!(!off.allow_image_override);
    // As the chart passes them.
    let on = cfg(&[
        "--allow-sidecar-image-override=true",
        "--allowed-sidecar-images=registry.example.com/memprof/*, ghcr.io/memprof/memprof:0.2.0",
    ])
    .unwrap();
    assert!(on.allow_image_override);
    assert_eq!(
        on.allowed_images,
        [
            "registry.example.com/memprof/*",
            "ghcr.io/memprof/memprof:0.2.0"
        ]
    );
    let empty = cfg(&["--allowed-sidecar-images="]).unwrap();
    assert!(empty.allowed_images.is_empty());
    let bad = cfg(&["--allowed-sidecar-images=a/*/b"]).unwrap_err();
    assert!(bad.contains("may only end"), "{bad}");
}

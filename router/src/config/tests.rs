//! Tests of the router's settings.

use super::*;

#[test]
#[allow(clippy::result_large_err)] // figment::Jail's closure signature
fn precedence_file_env_flags() {
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "r.toml",
            "workers = ['a:1', 'b:2']\n[limits]\nmax_new_tokens = 10\nmax_stop_sequences = 2",
        )?;
        jail.set_env("ROUTER_LIMITS__MAX_NEW_TOKENS", "20");
        let cli = Cli::parse_from(["router", "--config", "r.toml", "--listen", "127.0.0.1:9"]);
        let s = RouterSettings::load(&cli).map_err(|e| e.to_string())?;
        assert_eq!(s.workers, vec!["a:1", "b:2"]);
        assert_eq!(s.limits.max_new_tokens, 20);
        assert_eq!(s.limits.max_stop_sequences, 2);
        assert_eq!(s.listen.port(), 9);
        let cli = Cli::parse_from(["router", "--workers", "x:1, y:2"]);
        let s = RouterSettings::load(&cli).map_err(|e| e.to_string())?;
        assert_eq!(s.workers, vec!["x:1", "y:2"]);
        assert_eq!(s.discovery(), None);
        jail.set_env("ROUTER_MAX_WAITING_REQUESTS", "7");
        jail.set_env("ROUTER_AFFINITY_PREFIX_TOKENS", "0");
        let cli = Cli::parse_from(["router", "--discovery-dns", "w.ns.svc:50061"]);
        let s = RouterSettings::load(&cli).map_err(|e| e.to_string())?;
        let p = s.pool_settings();
        assert_eq!(p.admission.max_waiting_requests, 7);
        assert_eq!(p.affinity.prefix_tokens, 0);
        assert_eq!(p.max_inflight_per_worker, 64);
        assert_eq!(p.stall_timeout, Duration::from_secs(60));
        assert_eq!(p.heartbeat_timeout, Some(Duration::from_secs(2)));
        assert_eq!(p.slow_client_timeout, Duration::from_secs(30));
        assert_eq!(s.discovery().unwrap().0, "w.ns.svc:50061");
        jail.set_env("ROUTER_STALL_TIMEOUT_MS", "900");
        let s = RouterSettings::load(&cli).map_err(|e| e.to_string())?;
        assert_eq!(s.pool_settings().stall_timeout, Duration::from_millis(900));
        jail.set_env("ROUTER_HEARTBEAT_TIMEOUT_MS", "0");
        let s = RouterSettings::load(&cli).map_err(|e| e.to_string())?;
        assert_eq!(s.pool_settings().heartbeat_timeout, None);
        assert_eq!(p.reconnect_grace, Duration::from_secs(2));
        jail.set_env("ROUTER_RECONNECT_GRACE_MS", "0");
        let s = RouterSettings::load(&cli).map_err(|e| e.to_string())?;
        assert_eq!(s.pool_settings().reconnect_grace, Duration::ZERO);
        let flagged = Cli::parse_from(["router", "--reconnect-grace-ms", "350"]);
        let s = RouterSettings::load(&flagged).map_err(|e| e.to_string())?;
        assert_eq!(
            s.pool_settings().reconnect_grace,
            Duration::from_millis(350)
        );
        jail.set_env("ROUTER_SLOW_CLIENT_TIMEOUT_MS", "750");
        let s = RouterSettings::load(&cli).map_err(|e| e.to_string())?;
        assert_eq!(
            s.pool_settings().slow_client_timeout,
            Duration::from_millis(750)
        );
        // 0: never cancel.
        jail.set_env("ROUTER_SLOW_CLIENT_TIMEOUT_MS", "0");
        let s = RouterSettings::load(&cli).map_err(|e| e.to_string())?;
        assert_eq!(s.pool_settings().slow_client_timeout, Duration::MAX);
        let cli = Cli::parse_from(["router", "--workers", "a:1", "--stall-timeout-ms", "1200"]);
        let s = RouterSettings::load(&cli).map_err(|e| e.to_string())?;
        assert_eq!(s.stall_timeout_ms, 1200);
        assert_eq!(s.http_listen(), None);
        jail.set_env("ROUTER_MODEL_ALIASES", "gpt-x, smol");
        let cli = Cli::parse_from([
            "router",
            "--workers",
            "a:1",
            "--http-listen",
            "127.0.0.1:8000",
            "--served-model-name",
            "smollm2",
        ]);
        let s = RouterSettings::load(&cli).map_err(|e| e.to_string())?;
        assert_eq!(s.http_listen().unwrap().port(), 8000);
        let names = s.model_naming();
        assert_eq!(names.served_model_name, "smollm2");
        assert_eq!(names.aliases, vec!["gpt-x", "smol"]);
        let bad = RouterSettings {
            http_listen: "nope".into(),
            ..s
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("http_listen \"nope\""));
        Ok(())
    });
}

#[test]
#[allow(clippy::result_large_err)] // figment::Jail's closure signature
fn misspelt_file_key_is_an_error() {
    figment::Jail::expect_with(|jail| {
        jail.create_file("r.toml", "[limits]\nmax_new_tokenz = 5\n")?;
        let cli = Cli::parse_from(["router", "--config", "r.toml"]);
        let err = RouterSettings::load(&cli).unwrap_err().to_string();
        assert!(
            err.contains("unknown setting `limits.max_new_tokenz`"),
            "{err}"
        );
        Ok(())
    });
}

/// A key setting that names no key is refused at start instead of leaving the router open.
#[test]
#[allow(clippy::result_large_err)] // figment::Jail's closure signature
fn api_keys_of_only_separators_are_refused() {
    figment::Jail::expect_with(|jail| {
        jail.set_env("ROUTER_API_KEYS", " , ");
        let cli = Cli::parse_from(["router", "--workers", "a:1"]);
        let err = RouterSettings::load(&cli)
            .map(drop)
            .unwrap_err()
            .to_string();
        assert!(err.contains("names no key"), "{err}");
        jail.set_env("ROUTER_API_KEYS", "");
        let s = RouterSettings::load(&cli).map_err(|e| e.to_string())?;
        assert!(s.api_keys.is_empty());
        Ok(())
    });
}

#[test]
#[allow(clippy::result_large_err)] // figment::Jail's closure signature
fn api_keys_from_env_and_file_are_checked_and_redacted() {
    figment::Jail::expect_with(|jail| {
        jail.set_env("ROUTER_API_KEYS", "k1, k2");
        let cli = Cli::parse_from(["router", "--workers", "a:1"]);
        let s = RouterSettings::load(&cli).map_err(|e| e.to_string())?;
        assert_eq!(s.api_keys, vec!["k1", "k2"]);
        let keys = s.api_keys().unwrap();
        assert!(keys.check(Some(b"Bearer k2")).is_ok());
        let shown = serde_json::to_string(&s).unwrap();
        assert!(
            !shown.contains("k1") && shown.contains("<redacted>"),
            "{shown}"
        );
        jail.create_file("keys.txt", "# comment\nk3\n")?;
        let cli = Cli::parse_from(["router", "--workers", "a:1", "--api-keys-file", "keys.txt"]);
        let s = RouterSettings::load(&cli).map_err(|e| e.to_string())?;
        assert!(s.validate().is_ok());
        assert!(s.api_keys().unwrap().check(Some(b"Bearer k3")).is_ok());
        let bad = RouterSettings {
            api_keys_file: "missing.txt".into(),
            ..s
        };
        let err = bad.validate().unwrap_err().to_string();
        assert!(
            err.contains("cannot read the API key file missing.txt"),
            "{err}"
        );
        Ok(())
    });
}

#[test]
fn health_and_stall_times_are_checked() {
    let ok = RouterSettings {
        workers: vec!["a:1".into()],
        ..Default::default()
    };
    assert!(ok.validate().is_ok());
    let err = RouterSettings {
        stall_timeout_ms: 0,
        ..ok.clone()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("stall_timeout_ms (0) must be at least health_interval_ms (2000)"),
        "{err}"
    );
    let err = RouterSettings {
        health_interval_ms: 0,
        ..ok
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(err.contains("health_interval_ms 0 is below 10"), "{err}");
}

#[test]
fn a_lowered_maximum_caps_the_default_instead_of_refusing() {
    let mut s = RouterSettings {
        workers: vec!["a:1".into()],
        ..Default::default()
    };
    s.limits.max_new_tokens = 7;
    assert!(s.validate().is_ok());
    assert_eq!(s.limits.default_new_tokens(), 7);
    s.limits.max_new_tokens = 0;
    assert!(s
        .validate()
        .unwrap_err()
        .to_string()
        .contains("must be at least 1"));
}

#[test]
fn tls_settings_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let ca = tls_certs::test_ca::TestCa::new("ca");
    let (ca_file, files) = ca.write(dir.path(), "router", &["localhost"]);
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let ok = RouterSettings {
        workers: vec!["a:1".into()],
        ..Default::default()
    };
    assert!(ok.tls_cert().unwrap().is_none() && ok.worker_tls().unwrap().is_none());
    let tls = RouterSettings {
        tls_cert: path(&files.cert),
        tls_key: path(&files.key),
        worker_tls_ca: path(&ca_file),
        worker_tls_server_name: "worker.local".into(),
        health_listen: "127.0.0.1:7".into(),
        ..ok.clone()
    };
    assert!(tls.validate().is_ok());
    assert!(tls.tls_cert().unwrap().is_some());
    assert_eq!(
        tls.worker_tls().unwrap().unwrap().server_name.as_deref(),
        Some("worker.local")
    );
    assert_eq!(tls.health_listen().unwrap().port(), 7);
    let err = |s: RouterSettings| s.validate().unwrap_err().to_string();
    let half = err(RouterSettings {
        tls_key: String::new(),
        ..tls.clone()
    });
    assert!(
        half.contains("`tls_cert` is set but `tls_key` is not"),
        "{half}"
    );
    let missing = err(RouterSettings {
        tls_key: "/nonexistent/router.key".into(),
        ..tls.clone()
    });
    assert_eq!(
        missing,
        "cannot read TLS key file /nonexistent/router.key: No such file or directory (os error 2)"
    );
    let swapped = err(RouterSettings {
        tls_cert: path(&files.key),
        ..tls.clone()
    });
    assert!(
        swapped.starts_with(&format!(
            "invalid TLS certificate file {}",
            files.key.display()
        )),
        "{swapped}"
    );
    let no_ca = err(RouterSettings {
        worker_tls_ca: String::new(),
        ..tls.clone()
    });
    assert_eq!(
        no_ca,
        "`worker_tls_server_name` is set but `worker_tls_ca` is not"
    );
    let bad_ca = err(RouterSettings {
        worker_tls_ca: path(&files.key),
        ..tls.clone()
    });
    assert!(bad_ca.starts_with("invalid TLS CA file"), "{bad_ca}");
    let bad_health = err(RouterSettings {
        health_listen: "nope".into(),
        ..tls
    });
    assert!(
        bad_health.contains("health_listen \"nope\""),
        "{bad_health}"
    );
}

#[test]
#[allow(clippy::result_large_err)] // figment::Jail's closure signature
fn tls_settings_from_flags_and_env() {
    figment::Jail::expect_with(|jail| {
        jail.set_env("ROUTER_WORKER_TLS_CA", "ca.pem");
        let cli = Cli::parse_from([
            "router",
            "--workers",
            "a:1",
            "--tls-cert",
            "r.crt",
            "--tls-key",
            "r.key",
            "--health-listen",
            "127.0.0.1:9",
        ]);
        let s = RouterSettings::load(&cli).map_err(|e| e.to_string())?;
        assert_eq!(
            s.tls_cert_files().unwrap(),
            Some(tls_certs::CertFiles {
                cert: "r.crt".into(),
                key: "r.key".into()
            })
        );
        assert_eq!(s.worker_tls_ca, "ca.pem");
        assert_eq!(s.health_listen, "127.0.0.1:9");
        Ok(())
    });
}

#[test]
#[allow(clippy::result_large_err)] // figment::Jail's closure signature
fn the_kv_decode_weight_from_file_and_env() {
    figment::Jail::expect_with(|jail| {
        jail.create_file("r.toml", "workers = ['a:1']\nkv_decode_weight = 0.25")?;
        let file = Cli::parse_from(["router", "--config", "r.toml"]);
        let s = RouterSettings::load(&file).map_err(|e| e.to_string())?;
        assert_eq!(s.pool_settings().kv_aware.decode_weight, 0.25);
        jail.set_env("ROUTER_KV_DECODE_WEIGHT", "0");
        let s = RouterSettings::load(&file).map_err(|e| e.to_string())?;
        assert_eq!(s.pool_settings().kv_aware.decode_weight, 0.0);
        jail.set_env("ROUTER_KV_DECODE_WEIGHT", "-1");
        let s = RouterSettings::load(&file).map_err(|e| e.to_string())?;
        let err = s.validate().unwrap_err().to_string();
        assert!(
            err.contains("kv_decode_weight must be a number >= 0 (got -1)"),
            "{err}"
        );
        Ok(())
    });
}

#[test]
#[allow(clippy::result_large_err)] // figment::Jail's closure signature
fn routing_from_file_env_and_flag() {
    figment::Jail::expect_with(|jail| {
        let none = Cli::parse_from(["router"]);
        let s = RouterSettings::load(&none).map_err(|e| e.to_string())?;
        assert_eq!(s.pool_settings().routing, Routing::KvAware, "the default");
        jail.create_file("r.toml", "routing = 'round_robin'")?;
        let file = Cli::parse_from(["router", "--config", "r.toml"]);
        let s = RouterSettings::load(&file).map_err(|e| e.to_string())?;
        assert_eq!(s.routing, Routing::RoundRobin);
        jail.set_env("ROUTER_ROUTING", "kv_aware");
        let s = RouterSettings::load(&file).map_err(|e| e.to_string())?;
        assert_eq!(s.routing, Routing::KvAware);
        let flag = Cli::parse_from(["router", "--config", "r.toml", "--routing", "affinity"]);
        let s = RouterSettings::load(&flag).map_err(|e| e.to_string())?;
        assert_eq!(s.routing, Routing::Affinity);
        let bad = Cli::parse_from(["router", "--routing", "kv-aware"]);
        let err = RouterSettings::load(&bad).unwrap_err().to_string();
        assert!(
            err.contains("kv-aware") && err.contains("kv_aware"),
            "{err}"
        );
        Ok(())
    });
}

/// `kv_prefill_weight` and `kv_decode_weight`: defaults, 0 allowed, negative and non-finite values
/// refused naming the setting.
#[test]
fn the_kv_weights_are_numbers_of_at_least_zero() {
    type Set = fn(&mut RouterSettings, f64);
    type Get = fn(&routing::kv_aware::KvAwarePolicy) -> f64;
    let ok = RouterSettings {
        workers: vec!["a:1".into()],
        ..Default::default()
    };
    let weights: [(&str, Set, Get, f64); 2] = [
        (
            "kv_prefill_weight",
            |s, w| s.kv_prefill_weight = w,
            |p| p.prefill_weight,
            routing::kv_aware::DEFAULT_PREFILL_WEIGHT,
        ),
        (
            "kv_decode_weight",
            |s, w| s.kv_decode_weight = w,
            |p| p.decode_weight,
            routing::kv_aware::DEFAULT_DECODE_WEIGHT,
        ),
    ];
    for (name, set, get, default) in weights {
        assert_eq!(get(&ok.pool_settings().kv_aware), default, "{name}");
        for bad in [-1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let mut s = ok.clone();
            set(&mut s, bad);
            let err = s.validate().unwrap_err().to_string();
            assert!(
                err.contains(&format!("{name} must be a number >= 0")),
                "{name}: {err}"
            );
        }
        let mut zero = ok.clone();
        set(&mut zero, 0.0);
        assert!(zero.validate().is_ok(), "{name}");
        assert_eq!(get(&zero.pool_settings().kv_aware), 0.0, "{name}");
    }
}

{{/* Chart name. */}}
{{- define "smollm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/*
Full name of the release's objects. Kept to 40 characters so that the longest derived name
(<fullname>-worker-headless) and the StatefulSet's pod and revision names stay DNS labels.
*/}}
{{- define "smollm.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "smollm.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "smollm.router.name" -}}{{ include "smollm.fullname" . }}-router{{- end -}}
{{- define "smollm.router.headless" -}}{{ include "smollm.fullname" . }}-router-replicas{{- end -}}
{{- define "smollm.worker.name" -}}{{ include "smollm.fullname" . }}-worker{{- end -}}
{{- define "smollm.worker.headless" -}}{{ include "smollm.fullname" . }}-worker-headless{{- end -}}
{{- define "smollm.config.name" -}}{{ include "smollm.fullname" . }}-config{{- end -}}

{{- define "smollm.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "smollm.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "smollm.labels" -}}
helm.sh/chart: {{ include "smollm.chart" . }}
app.kubernetes.io/name: {{ include "smollm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: smollm-serve
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "router"), with "group" (a worker
group's name) for one worker group's pods. */}}
{{- define "smollm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "smollm.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- with .group }}
smollm-serve/worker-group: {{ . }}
{{- end }}
{{- end -}}

{{/* Labels of one component's objects: (dict "ctx" $ "component" "router"), with "group" for a
worker group's objects. */}}
{{- define "smollm.componentLabels" -}}
{{ include "smollm.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- with .group }}
smollm-serve/worker-group: {{ . }}
{{- end }}
{{- end -}}

{{/* An image reference from {registry, repository, tag, digest}: (dict "image" ... "ctx" $). */}}
{{- define "smollm.image" -}}
{{- $image := .image -}}
{{- $ref := $image.repository -}}
{{- if $image.registry -}}{{- $ref = printf "%s/%s" $image.registry $image.repository -}}{{- end -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $ref $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $ref (default .ctx.Chart.AppVersion $image.tag | toString) -}}
{{- end -}}
{{- end -}}

{{/* The worker's headless service DNS name (what the router's discovery_dns resolves). */}}
{{/* The router replicas' headless Service's DNS name (their `replica_discovery_dns`). */}}
{{- define "smollm.router.dnsName" -}}
{{- printf "%s.%s.svc.%s" (include "smollm.router.headless" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{- define "smollm.worker.dnsName" -}}
{{- printf "%s.%s.svc.%s" (include "smollm.worker.headless" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/* "IP:PORT" a server binds in its pod. */}}
{{- define "smollm.bind" -}}
{{- printf "%s:%d" .ctx.Values.bindAddress (int .port) -}}
{{- end -}}

{{/*
Grace period of a component: (dict "drainMs" ... "extra" seconds "override" value "what" "router").
Derived: drain (rounded up to seconds) + extra + 15 s. An explicit value must exceed drain + extra.
*/}}
{{- define "smollm.gracePeriod" -}}
{{- $drainS := div (add (int64 .drainMs) 999) 1000 -}}
{{- $floor := add $drainS (int64 .extra) -}}
{{- if kindIs "invalid" .override -}}
{{- add $floor 15 -}}
{{- else if le (int64 .override) $floor -}}
{{- fail (printf "%s.terminationGracePeriodSeconds (%d) must exceed the drain (%s.config.drain_timeout_ms = %d ms, plus preStop %d s): Kubernetes would kill the pod mid-drain" .what (int64 .override) .what (int64 .drainMs) (int64 .extra)) -}}
{{- else -}}
{{- int64 .override -}}
{{- end -}}
{{- end -}}

{{/*
A TOML value from a values entry. Numbers read from YAML are float64 in Helm: integral ones are
written as integers (the binaries' integer settings reject 100.0).
*/}}
{{- define "smollm.tomlValue" -}}
{{- $v := . -}}
{{- if kindIs "string" $v -}}
{{- toJson $v -}}
{{- else if kindIs "bool" $v -}}
{{- $v -}}
{{- else if kindIs "float64" $v -}}
{{- if eq $v (floor $v) -}}{{- int64 $v -}}{{- else -}}{{- $v -}}{{- end -}}
{{- else if or (kindIs "int" $v) (kindIs "int64" $v) -}}
{{- $v -}}
{{- else if kindIs "slice" $v -}}
[{{- range $i, $e := $v -}}{{- if $i -}}, {{ end -}}{{- include "smollm.tomlValue" $e -}}{{- end -}}]
{{- else -}}
{{- fail (printf "cannot write %v (%s) as a TOML value" $v (kindOf $v)) -}}
{{- end -}}
{{- end -}}

{{/* A TOML document from a map: scalar keys first, then one [table] per nested map. Nulls are left out. */}}
{{- define "smollm.toml" -}}
{{- range $k, $v := . -}}
{{- if not (or (kindIs "map" $v) (kindIs "invalid" $v)) }}
{{ $k }} = {{ include "smollm.tomlValue" $v }}
{{- end -}}
{{- end -}}
{{- range $k, $v := . -}}
{{- if kindIs "map" $v }}

[{{ $k }}]
{{- range $k2, $v2 := $v -}}
{{- if not (kindIs "invalid" $v2) }}
{{ $k2 }} = {{ include "smollm.tomlValue" $v2 }}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The router's settings file (values router.config plus what the chart owns). */}}
{{- define "smollm.router.toml" -}}
{{- $owned := dict "listen" (include "smollm.bind" (dict "ctx" . "port" .Values.router.port)) -}}
{{- $_ := set $owned "metrics_listen" (ternary (include "smollm.bind" (dict "ctx" . "port" .Values.router.metricsPort)) "" .Values.metrics.enabled) -}}
{{- $_ := set $owned "http_listen" (ternary (include "smollm.bind" (dict "ctx" . "port" .Values.router.http.port)) "" .Values.router.http.enabled) -}}
{{- $_ := set $owned "discovery_dns" (printf "%s:%d" (include "smollm.worker.dnsName" .) (int .Values.worker.port)) -}}
{{- $_ := set $owned "replica_discovery_dns" (printf "%s:%d" (include "smollm.router.dnsName" .) (int .Values.router.port)) -}}
{{- include "smollm.toml" (merge $owned (deepCopy .Values.router.config)) -}}
{{- end -}}

{{/* The settings file of one worker group: (dict "ctx" $ "g" group), a group of
"smollm.worker.groups". The ports are the release's (worker.port, worker.metricsPort). */}}
{{- define "smollm.worker.toml" -}}
{{- $ctx := .ctx -}}
{{- $owned := dict "listen" (include "smollm.bind" (dict "ctx" $ctx "port" $ctx.Values.worker.port)) -}}
{{- $_ := set $owned "metrics_listen" (ternary (include "smollm.bind" (dict "ctx" $ctx "port" $ctx.Values.worker.metricsPort)) "" $ctx.Values.metrics.enabled) -}}
{{- $_ := set $owned "model" (include "smollm.model.path" .g.m) -}}
{{- include "smollm.toml" (merge $owned (deepCopy .g.w.config)) -}}
{{- end -}}

{{/* The model file's path in the pod, from a model values map (values `model`, or a group's). */}}
{{- define "smollm.model.path" -}}
{{- printf "%s/%s" (.mountPath | trimSuffix "/") (.file | trimPrefix "/") -}}
{{- end -}}

{{/* `base` with `over` laid on it, as JSON: maps merge key by key (recursively), anything else in
`over` replaces, zeros, false and empty lists included (unlike Helm's merge). (dict "base" .. "over" ..) */}}
{{- define "smollm.overlay" -}}
{{- $out := deepCopy .base -}}
{{- range $k, $v := .over -}}
{{- if and (kindIs "map" $v) (kindIs "map" (get $out $k)) -}}
{{- $_ := set $out $k (include "smollm.overlay" (dict "base" (get $out $k) "over" $v) | fromJson) -}}
{{- else -}}
{{- $_ := set $out $k $v -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
The worker groups as a JSON list; each group: name ("" for the single group of values `worker`),
sts (StatefulSet, PDB, NetworkPolicy and InferencePool name), headless (its headless Service),
configKey (its settings file in the ConfigMap), w (worker values) and m (model values).
Without `workers` there is one group, values `worker` and `model` as they are: each template sets
that group's "w" and "m" to the values maps themselves (not a JSON copy), so it renders as before:
  {{- $groups := include "smollm.worker.groups" . | fromJsonArray }}
  {{- range $groups }}{{ if not .name }}{{ $_ := set . "w" $.Values.worker }}{{ $_ := set . "m" $.Values.model }}{{ end }}{{ end }} With `workers`, each
entry is laid over values `worker` (its `model` over values `model`; `device` is `config.device`):
maps merge key by key, except `resources`, `nodeSelector`, `affinity` and `model.volume`, which
replace the release's whole (a CPU group must not inherit a GPU node selector).
*/}}
{{- define "smollm.worker.groups" -}}
{{- $groups := list -}}
{{- if not .Values.workers -}}
{{- $groups = append $groups (dict "name" "" "sts" (include "smollm.worker.name" .) "headless" (include "smollm.worker.headless" .) "configKey" "worker.toml") -}}
{{- else -}}
{{- $seen := dict -}}
{{- range $i, $grp := .Values.workers -}}
{{- $name := required (printf "workers[%d].name is required" $i) $grp.name -}}
{{- if hasKey $seen $name -}}
{{- fail (printf "workers: the group name %q is used twice" $name) -}}
{{- end -}}
{{- $_ := set $seen $name true -}}
{{- $w := include "smollm.overlay" (dict "base" $.Values.worker "over" (omit $grp "name" "model" "device" "resources" "nodeSelector" "affinity")) | fromJson -}}
{{- range $k := list "resources" "nodeSelector" "affinity" -}}
{{- if hasKey $grp $k -}}{{- $_ := set $w $k (get $grp $k) -}}{{- end -}}
{{- end -}}
{{- if hasKey $grp "device" -}}
{{- if and (hasKey (default dict $grp.config) "device") (ne (toString $grp.config.device) (toString $grp.device)) -}}
{{- fail (printf "workers[%d] (%s): device %q and config.device %q disagree; set one" $i $name $grp.device $grp.config.device) -}}
{{- end -}}
{{- $_ := set $w.config "device" $grp.device -}}
{{- end -}}
{{- $mo := default dict $grp.model -}}
{{- $m := include "smollm.overlay" (dict "base" $.Values.model "over" (omit $mo "volume")) | fromJson -}}
{{- if hasKey $mo "volume" -}}{{- $_ := set $m "volume" $mo.volume -}}{{- end -}}
{{- $sts := printf "%s-%s" (include "smollm.worker.name" $) $name -}}
{{- if gt (len $sts) 52 -}}
{{- fail (printf "workers[%d]: the StatefulSet name %q is longer than 52 characters (its pods' revision labels would not be valid); shorten the group name or fullnameOverride" $i $sts) -}}
{{- end -}}
{{- $groups = append $groups (dict "name" $name "sts" $sts "headless" (printf "%s-headless" $sts) "configKey" (printf "worker-%s.toml" $name) "w" $w "m" $m) -}}
{{- end -}}
{{- end -}}
{{- toJson $groups -}}
{{- end -}}

{{/* Pod-level settings shared by both components: (dict "ctx" $ "values" .Values.router "component" "router"). */}}
{{- define "smollm.podScheduling" -}}
{{- $v := .values -}}
{{- with $v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if kindIs "invalid" $v.topologySpreadConstraints }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "smollm.selectorLabels" (dict "ctx" .ctx "component" .component "group" .group) | nindent 8 }}
{{- else if $v.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml $v.topologySpreadConstraints | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The port the probes of a component ask: its plain health port when it serves TLS, else its
gRPC port. (dict "values" .Values.router) */}}
{{- define "smollm.probePort" -}}
{{- if .values.tls.existingSecret -}}{{ .values.healthPort }}{{- else -}}{{ .values.port }}{{- end -}}
{{- end -}}

{{/* The Secret holding the CA the routers trust for the workers ("" = worker TLS off). */}}
{{- define "smollm.worker.caSecret" -}}
{{- if .Values.worker.tls.existingSecret -}}{{ default .Values.worker.tls.existingSecret .Values.worker.tls.caSecret }}{{- end -}}
{{- end -}}

{{/* Whether worker group `g` gets a GIE pool, and so the router sidecar: "true" or "". (dict "ctx" $ "g" group) */}}
{{- define "smollm.gie.selected" -}}
{{- $gie := .ctx.Values.gie -}}
{{- if and $gie.enabled (or (not $gie.groups) (has .g.name $gie.groups)) -}}true{{- end -}}
{{- end -}}

{{/* The pod's loopback address in the family of bindAddress (127.0.0.1, or [::1] for "[::]"). */}}
{{- define "smollm.loopback" -}}
{{- if hasPrefix "[" .Values.bindAddress -}}[::1]{{- else -}}127.0.0.1{{- end -}}
{{- end -}}

{{/*
The settings file of the GIE router sidecar (values gie.sidecar): router.config, its only worker the
worker of its own pod over loopback, the OpenAI HTTP API on gie.sidecar.port (the pools' target
port), the gRPC API on loopback only, no discovery, no metrics port (the picker reads the worker's).
*/}}
{{- define "smollm.gie.router.toml" -}}
{{- $loop := include "smollm.loopback" . -}}
{{- $owned := dict "listen" (printf "%s:%d" $loop (int .Values.router.port)) -}}
{{- $_ := set $owned "metrics_listen" "" -}}
{{- $_ := set $owned "http_listen" (include "smollm.bind" (dict "ctx" . "port" .Values.gie.sidecar.port)) -}}
{{- $_ := set $owned "discovery_dns" "" -}}
{{- $_ := set $owned "workers" (list (printf "%s:%d" $loop (int .Values.worker.port))) -}}
{{- include "smollm.toml" (merge $owned (deepCopy .Values.router.config)) -}}
{{- end -}}

{{/* The release's base name, at most 63 characters. */}}
{{- define "lightning-sidecar.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "lightning-sidecar.configName" -}}
{{- printf "%s-config" (include "lightning-sidecar.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "lightning-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "lightning-sidecar.labels" -}}
{{ include "lightning-sidecar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The sidecar's YAML config, from values. .Values.config is merged over it, so any config key can be
set without a chart change.
*/}}
{{- define "lightning-sidecar.config" -}}
{{- $v := .Values -}}
{{- $kafka := dict "brokers" $v.kafka.brokers "topic" $v.kafka.topic "trajectories_topic" $v.kafka.trajectoriesTopic "episodes_topic" $v.kafka.episodesTopic "encoding" $v.kafka.encoding -}}
{{- if $v.kafka.sasl.enabled -}}
{{- $_ := set $kafka "sasl" (dict "mechanism" $v.kafka.sasl.mechanism) -}}
{{- end -}}
{{- if $v.kafka.tls.enabled -}}
{{- $_ := set $kafka "tls" (dict "enabled" true) -}}
{{- end -}}
{{- $cfg := dict
  "receivers" (dict
    "llm_proxy" (dict "endpoint" (printf "127.0.0.1:%d" (int $v.ports.proxy)) "upstream_url" $v.upstream.url "upstream_flavor" $v.upstream.flavor
      "routing" (dict "policy" (default "sticky" ($v.upstream.routing).policy) "dns_refresh_ms" (int (default 5000 ($v.upstream.routing).dnsRefreshMs)))
      "token_in" (dict "enabled" (default false $v.upstream.tokenIn.enabled) "tool_call_parser" (default "hermes" $v.upstream.tokenIn.toolCallParser) "reasoning_parser" (default "qwen3" $v.upstream.tokenIn.reasoningParser)))
    "otlp" (dict "protocols" (dict
      "grpc" (dict "endpoint" (printf "127.0.0.1:%d" (int $v.ports.otlpGrpc)))
      "http" (dict "endpoint" (printf "127.0.0.1:%d" (int $v.ports.otlpHttp))))))
  "exporters" (dict "records" $v.records "kafka" $kafka)
  "service" (dict
    "exporter" $v.exporter
    "data_dir" "/var/lib/lightning-sidecar"
    "log_level" $v.logLevel
    "shutdown_timeout_ms" (int $v.shutdownTimeoutMs)
    "telemetry" (dict "endpoint" (printf "0.0.0.0:%d" (int $v.ports.metrics))))
-}}
{{- if eq $v.exporter "file" -}}
{{- $_ := unset $cfg.exporters "kafka" -}}
{{- end -}}
{{- toYaml (mustMergeOverwrite $cfg (deepCopy $v.config)) -}}
{{- end -}}

{{/*
Just the sidecar container, as one list item: other charts can put it under `initContainers`
(with nativeSidecar, it carries restartPolicy: Always) or `containers`:

  initContainers:
    {{- include "lightning-sidecar.container" . | nindent 4 }}

It expects this chart's values layout (image, ports, probes, kafka, ...) and the ConfigMap named
by "lightning-sidecar.configName" and the volumes "lightning-config" and "lightning-data".
*/}}
{{- define "lightning-sidecar.container" -}}
- name: lightning-sidecar
  image: {{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if .Values.nativeSidecar }}
  restartPolicy: Always
  {{- end }}
  args: ["run", "--config", "/etc/lightning-sidecar/config.yaml"]
  env:
    - name: LIGHTNING_DATA_DIR
      value: /var/lib/lightning-sidecar
    {{- if and .Values.apiToken .Values.apiToken.existingSecret }}
    - name: LIGHTNING_API_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ .Values.apiToken.existingSecret }}
          key: {{ .Values.apiToken.key }}
    {{- end }}
    {{- if .Values.kafka.sasl.enabled }}
    - name: LIGHTNING_KAFKA_SASL_USERNAME
      valueFrom:
        secretKeyRef:
          name: {{ required "kafka.sasl.existingSecret is required when kafka.sasl.enabled" .Values.kafka.sasl.existingSecret }}
          key: {{ .Values.kafka.sasl.usernameKey }}
    - name: LIGHTNING_KAFKA_SASL_PASSWORD
      valueFrom:
        secretKeyRef:
          name: {{ .Values.kafka.sasl.existingSecret }}
          key: {{ .Values.kafka.sasl.passwordKey }}
    {{- end }}
  ports:
    - name: llm-proxy
      containerPort: {{ .Values.ports.proxy }}
      protocol: TCP
    - name: otlp-grpc
      containerPort: {{ .Values.ports.otlpGrpc }}
      protocol: TCP
    - name: otlp-http
      containerPort: {{ .Values.ports.otlpHttp }}
      protocol: TCP
    - name: metrics
      containerPort: {{ .Values.ports.metrics }}
      protocol: TCP
  startupProbe:
    httpGet:
      path: /readyz
      port: metrics
    {{- toYaml .Values.probes.startup | nindent 4 }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: metrics
    {{- toYaml .Values.probes.liveness | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: metrics
    {{- toYaml .Values.probes.readiness | nindent 4 }}
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: lightning-config
      mountPath: /etc/lightning-sidecar
      readOnly: true
    - name: lightning-data
      mountPath: /var/lib/lightning-sidecar
{{- end -}}

{{/* Names and labels. */}}
{{- define "relaunch.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "relaunch.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "relaunch.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "relaunch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- if not .Values.clusters }}
relaunch.io/cluster: {{ .Values.cluster.name | quote }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "worker"). A cluster of
`clusters` adds its name, so that its worker and watcher select their own pods only. */}}
{{- define "relaunch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "relaunch.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- if hasKey .root "relaunchCluster" }}
relaunch.io/cluster: {{ .root.relaunchCluster | quote }}
{{- end }}
{{- end -}}

{{/* The name of a cluster's own resource: <fullname>-worker with one cluster,
<fullname>-<cluster>-worker for an entry of `clusters`. (dict "root" ctx "component" "worker") */}}
{{- define "relaunch.clusterResourceName" -}}
{{- if hasKey .root "relaunchCluster" -}}
{{- printf "%s-%s-%s" (include "relaunch.fullname" .root) .root.relaunchCluster .component -}}
{{- else -}}
{{- printf "%s-%s" (include "relaunch.fullname" .root) .component -}}
{{- end -}}
{{- end -}}

{{/* Where a cluster's SSH key and slurmrestd key are mounted: under a directory of its own
with several clusters, because the console mounts every cluster's. */}}
{{- define "relaunch.sshDir" -}}
/etc/relaunch/ssh{{ if hasKey . "relaunchCluster" }}/{{ .relaunchCluster }}{{ end }}
{{- end -}}

{{- define "relaunch.jwtDir" -}}
/etc/relaunch/slurm-jwt{{ if hasKey . "relaunchCluster" }}/{{ .relaunchCluster }}{{ end }}
{{- end -}}

{{/*
The clusters of this release, as contexts for the templates: the root itself when `clusters`
is empty (one cluster, named by `cluster.name`), else one per entry of `clusters`. An entry's
context has the top-level values with the entry's settings merged over them (maps key by key,
lists replaced), `clusters` emptied, and the entry's name as relaunchCluster.
Call with (dict "root" $ "out" (dict)); the list is left in out.items.
*/}}
{{- define "relaunch.clusterContexts" -}}
{{- $root := .root -}}
{{- $items := list -}}
{{- if not $root.Values.clusters -}}
{{- $items = list $root -}}
{{- else -}}
{{- $clusterKeys := list "slurmConf" "nodeLogPattern" "telemetryPattern" -}}
{{- $sections := list "mode" "ssh" "incluster" "policy" "watch" "logs" "bundles" "worker" "watcher" -}}
{{- $allowed := concat (list "name") $clusterKeys $sections -}}
{{- $seen := dict -}}
{{- range $i, $entry := $root.Values.clusters -}}
{{- if not (kindIs "map" $entry) -}}
{{- fail (printf "clusters[%d] must be a map with a name" $i) -}}
{{- end -}}
{{- $name := toString (get $entry "name") -}}
{{- /* A DNS label: it goes into resource, label and volume names (ssh-<name>, slurm-jwt-<name>: 63 at most). */ -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "clusters[%d].name %q: lower-case letters, digits and '-', starting and ending with a letter or digit" $i $name) -}}
{{- end -}}
{{- if gt (len $name) 53 -}}
{{- fail (printf "clusters[%d].name %q: 53 characters at most" $i $name) -}}
{{- end -}}
{{- if hasKey $seen $name -}}
{{- fail (printf "clusters: %q is listed twice" $name) -}}
{{- end -}}
{{- $_ := set $seen $name true -}}
{{- range $key := keys $entry | sortAlpha -}}
{{- if not (has $key $allowed) -}}
{{- fail (printf "clusters[%s]: unknown key %q (an entry has %s)" $name $key (join ", " $allowed)) -}}
{{- end -}}
{{- end -}}
{{- $over := dict "cluster" (dict) -}}
{{- range $key := $clusterKeys -}}
{{- if hasKey $entry $key -}}
{{- $_ := set $over.cluster $key (get $entry $key) -}}
{{- end -}}
{{- end -}}
{{- range $key := $sections -}}
{{- if hasKey $entry $key -}}
{{- $_ := set $over $key (get $entry $key) -}}
{{- end -}}
{{- end -}}
{{- $values := mergeOverwrite (deepCopy $root.Values) (deepCopy $over) -}}
{{- $_ := set $values "clusters" (list) -}}
{{- $_ := set $values.cluster "name" $name -}}
{{- $ctx := dict "Values" $values "Release" $root.Release "Chart" $root.Chart "Capabilities" $root.Capabilities "Template" $root.Template "Files" $root.Files "relaunchCluster" $name -}}
{{- $items = append $items $ctx -}}
{{- end -}}
{{- end -}}
{{- $_ := set .out "items" $items -}}
{{- end -}}

{{- define "relaunch.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "relaunch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "relaunch.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Refuse values that cannot make a working release, with a message that says what to set. */}}
{{- define "relaunch.validate" -}}
{{- $where := "" -}}
{{- if hasKey . "relaunchCluster" -}}
{{- $where = printf "clusters[%s]: " .relaunchCluster -}}
{{- end -}}
{{- if not .Values.cluster.name -}}
{{- fail "cluster.name is required (or a list of clusters in `clusters`)" -}}
{{- end -}}
{{- if not (has .Values.mode (list "ssh" "incluster")) -}}
{{- fail (printf "%smode must be ssh or incluster, not %q" $where .Values.mode) -}}
{{- end -}}
{{- if not .Values.database.existingSecret -}}
{{- fail "database.existingSecret is required: a Secret holding the PostgreSQL DSN" -}}
{{- end -}}
{{- if eq .Values.mode "ssh" -}}
{{- if not .Values.ssh.host -}}
{{- fail (printf "%sssh mode: ssh.host is required" $where) -}}
{{- end -}}
{{- if not .Values.ssh.existingSecret -}}
{{- fail (printf "%sssh mode: ssh.existingSecret is required (private key and known_hosts)" $where) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.temporal.tls.enabled (not .Values.temporal.tls.existingSecret) -}}
{{- fail "temporal.tls.enabled: temporal.tls.existingSecret is required" -}}
{{- end -}}
{{- if and .Values.incluster.slurmrestd.enabled (not .Values.incluster.slurmrestd.existingSecret) -}}
{{- fail (printf "%sincluster.slurmrestd.enabled: incluster.slurmrestd.existingSecret is required" $where) -}}
{{- end -}}
{{- if and .Values.console.enabled (not .Values.console.tokens.existingSecret) -}}
{{- fail "console.enabled: console.tokens.existingSecret is required (token hashes)" -}}
{{- end -}}
{{- if and .Values.console.enabled (gt (int .Values.console.replicas) 1) (not .Values.console.sessionSecret.existingSecret) -}}
{{- fail "console.replicas > 1: console.sessionSecret.existingSecret is required" -}}
{{- end -}}
{{- if lt (int .Values.worker.replicas) 1 -}}
{{- fail (printf "%sworker.replicas must be 1 or more" $where) -}}
{{- end -}}
{{- $processes := int .Values.worker.processes -}}
{{- if or (lt $processes 1) (gt $processes 64) -}}
{{- fail (printf "%sworker.processes must be 1 to 64, not %v" $where .Values.worker.processes) -}}
{{- end -}}
{{- if le (int .Values.worker.terminationGracePeriodSeconds) 20 -}}
{{- fail (printf "%sworker.terminationGracePeriodSeconds must exceed the worker's 20 s graceful shutdown" $where) -}}
{{- end -}}
{{- end -}}

{{/*
The cluster configuration (relaunch.models.config.ClusterConfig) as JSON. It holds no secret:
database_url is "from-env:RELAUNCH_DATABASE_URL", which relaunch-entrypoint replaces with the
variable's value (from the database Secret) when it writes the configuration the process reads.
*/}}
{{- define "relaunch.config" -}}
{{- $v := .Values -}}
{{- $c := dict "name" $v.cluster.name "temporal_address" $v.temporal.address "temporal_namespace" $v.temporal.namespace "database_url" "from-env:RELAUNCH_DATABASE_URL" "bundle_dir" $v.bundles.mountPath "policy" $v.policy "watch" $v.watch "logs" $v.logs -}}
{{- if $v.temporal.ui -}}
{{- $_ := set $c "temporal_ui" $v.temporal.ui -}}
{{- end -}}
{{- if $v.cluster.nodeLogPattern -}}
{{- $_ := set $c "node_log_pattern" $v.cluster.nodeLogPattern -}}
{{- end -}}
{{- if $v.cluster.telemetryPattern -}}
{{- $_ := set $c "telemetry_pattern" $v.cluster.telemetryPattern -}}
{{- end -}}
{{- if eq $v.mode "ssh" -}}
{{- $sshDir := include "relaunch.sshDir" . -}}
{{- if $v.cluster.slurmConf -}}
{{- $_ := set $c "slurm_conf" $v.cluster.slurmConf -}}
{{- end -}}
{{- $_ := set $c "ssh" (dict "host" $v.ssh.host "port" $v.ssh.port "user" $v.ssh.user "key_file" (printf "%s/%s" $sshDir $v.ssh.privateKeyKey) "known_hosts" (printf "%s/%s" $sshDir $v.ssh.knownHostsKey) "connect_timeout_s" $v.ssh.connectTimeoutS "command_timeout_s" $v.ssh.commandTimeoutS) -}}
{{- else -}}
{{- $_ := set $c "slurm_conf" (default "/etc/slurm/slurm.conf" $v.cluster.slurmConf) -}}
{{- if $v.incluster.slurmrestd.enabled -}}
{{- $_ := set $c "slurmrestd" (dict "url" $v.incluster.slurmrestd.url "user" $v.incluster.slurmrestd.user "jwt_key_file" (printf "%s/%s" (include "relaunch.jwtDir" .) $v.incluster.slurmrestd.key) "api_version" ($v.incluster.slurmrestd.apiVersion | default "auto")) -}}
{{- end -}}
{{- end -}}
{{- if $v.temporal.tls.enabled -}}
{{- $tls := dict "client_cert" "/etc/relaunch/temporal-tls/tls.crt" "client_key" "/etc/relaunch/temporal-tls/tls.key" -}}
{{- if $v.temporal.tls.serverCA -}}
{{- $_ := set $tls "server_root_ca_cert" "/etc/relaunch/temporal-tls/ca.crt" -}}
{{- end -}}
{{- if $v.temporal.tls.serverName -}}
{{- $_ := set $tls "server_name" $v.temporal.tls.serverName -}}
{{- end -}}
{{- $_ := set $c "temporal_tls" $tls -}}
{{- end -}}
{{- $console := dict "host" "0.0.0.0" "port" $v.console.port "session_secret_env" "RELAUNCH_CONSOLE_SECRET" -}}
{{- if $v.console.tokens.existingSecret -}}
{{- $_ := set $console "tokens_file" (printf "/etc/relaunch/console/%s" $v.console.tokens.key) -}}
{{- end -}}
{{- if $v.console.behindTls -}}
{{- $_ := set $console "behind_tls" true -}}
{{- end -}}
{{- $_ := set $c "console" $console -}}
{{- if $v.monitoring.enabled -}}
{{- $_ := set $c "metrics" (dict "watch_address" (printf "0.0.0.0:%d" ($v.monitoring.ports.watcher | int)) "worker_address" (printf "0.0.0.0:%d" ($v.monitoring.ports.worker | int))) -}}
{{- end -}}
{{- toPrettyJson $c -}}
{{- end -}}

{{/* Pod-level settings shared by the three components: (dict "root" $ "component" "worker") */}}
{{- define "relaunch.podCommon" -}}
{{- $v := .root.Values -}}
serviceAccountName: {{ include "relaunch.serviceAccountName" .root }}
automountServiceAccountToken: false
{{- with $v.pullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml $v.podSecurityContext | nindent 2 }}
{{- $c := index $v .component }}
{{- with $c.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The volumes of one component: (dict "root" $ "component" "worker"). The console over
several clusters is called with "clusters" (their contexts) as well: it mounts each one's
configuration and the Secrets it names, but no host path (each cluster's slurm.conf and munge
socket are on that cluster's own hosts). */}}
{{- define "relaunch.volumes" -}}
{{- $v := .root.Values -}}
- name: config
{{- if hasKey . "clusters" }}
  projected:
    sources:
{{- range .clusters }}
      - configMap:
          name: {{ include "relaunch.clusterResourceName" (dict "root" . "component" "config") }}
          items:
            - key: cluster.json
              path: {{ .relaunchCluster }}.json
{{- end }}
{{- else }}
  configMap:
    name: {{ include "relaunch.clusterResourceName" (dict "root" .root "component" "config") }}
{{- end }}
- name: run
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
{{- if hasKey . "clusters" }}
{{- range .clusters }}
{{- $c := .Values }}
{{- if eq $c.mode "ssh" }}
- name: ssh-{{ .relaunchCluster }}
  secret:
    secretName: {{ $c.ssh.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ $c.ssh.privateKeyKey }}
        path: {{ $c.ssh.privateKeyKey }}
      - key: {{ $c.ssh.knownHostsKey }}
        path: {{ $c.ssh.knownHostsKey }}
{{- else if $c.incluster.slurmrestd.enabled }}
- name: slurm-jwt-{{ .relaunchCluster }}
  secret:
    secretName: {{ $c.incluster.slurmrestd.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ $c.incluster.slurmrestd.key }}
        path: {{ $c.incluster.slurmrestd.key }}
{{- end }}
{{- end }}
{{- else if eq $v.mode "ssh" }}
- name: ssh
  secret:
    secretName: {{ $v.ssh.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ $v.ssh.privateKeyKey }}
        path: {{ $v.ssh.privateKeyKey }}
      - key: {{ $v.ssh.knownHostsKey }}
        path: {{ $v.ssh.knownHostsKey }}
{{- else }}
- name: slurm-conf
{{- if $v.incluster.slurmConfConfigMap }}
  configMap:
    name: {{ $v.incluster.slurmConfConfigMap }}
{{- else }}
  hostPath:
    path: {{ $v.incluster.slurmConfHostPath }}
    type: Directory
{{- end }}
- name: munge
  hostPath:
    path: {{ $v.incluster.mungeSocketHostPath }}
    type: Directory
{{- if $v.incluster.slurmrestd.enabled }}
- name: slurm-jwt
  secret:
    secretName: {{ $v.incluster.slurmrestd.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ $v.incluster.slurmrestd.key }}
        path: {{ $v.incluster.slurmrestd.key }}
{{- end }}
{{- end }}
{{- if $v.temporal.tls.enabled }}
- name: temporal-tls
  secret:
    secretName: {{ $v.temporal.tls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- if eq .component "worker" }}
- name: bundles
{{- if $v.bundles.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ $v.bundles.existingClaim }}
{{- else }}
  emptyDir: {}
{{- end }}
{{- end }}
{{- if and (eq .component "console") $v.console.tokens.existingSecret }}
- name: console-tokens
  secret:
    secretName: {{ $v.console.tokens.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ $v.console.tokens.key }}
        path: {{ $v.console.tokens.key }}
{{- end }}
{{- with $v.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The container's mounts, matching relaunch.volumes. */}}
{{- define "relaunch.volumeMounts" -}}
{{- $v := .root.Values -}}
- name: config
  mountPath: /etc/relaunch/config
  readOnly: true
- name: run
  mountPath: /run/relaunch
- name: tmp
  mountPath: /tmp
{{- if hasKey . "clusters" }}
{{- range .clusters }}
{{- if eq .Values.mode "ssh" }}
- name: ssh-{{ .relaunchCluster }}
  mountPath: {{ include "relaunch.sshDir" . }}
  readOnly: true
{{- else if .Values.incluster.slurmrestd.enabled }}
- name: slurm-jwt-{{ .relaunchCluster }}
  mountPath: {{ include "relaunch.jwtDir" . }}
  readOnly: true
{{- end }}
{{- end }}
{{- else if eq $v.mode "ssh" }}
- name: ssh
  mountPath: {{ include "relaunch.sshDir" .root }}
  readOnly: true
{{- else }}
- name: slurm-conf
  mountPath: /etc/slurm
  readOnly: true
- name: munge
  mountPath: /run/munge
{{- if $v.incluster.slurmrestd.enabled }}
- name: slurm-jwt
  mountPath: {{ include "relaunch.jwtDir" .root }}
  readOnly: true
{{- end }}
{{- end }}
{{- if $v.temporal.tls.enabled }}
- name: temporal-tls
  mountPath: /etc/relaunch/temporal-tls
  readOnly: true
{{- end }}
{{- if eq .component "worker" }}
- name: bundles
  mountPath: {{ $v.bundles.mountPath }}
{{- end }}
{{- if and (eq .component "console") $v.console.tokens.existingSecret }}
- name: console-tokens
  mountPath: /etc/relaunch/console
  readOnly: true
{{- end }}
{{- with $v.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The container's environment: secrets by reference only. The console over several clusters
has a directory of configurations (relaunch-entrypoint writes each one). */}}
{{- define "relaunch.env" -}}
{{- $v := .root.Values -}}
{{- if hasKey . "clusters" -}}
- name: RELAUNCH_CONFIG_TEMPLATE
  value: /etc/relaunch/config
- name: RELAUNCH_CONFIG
  value: /run/relaunch/clusters
{{- else -}}
- name: RELAUNCH_CONFIG_TEMPLATE
  value: /etc/relaunch/config/cluster.json
- name: RELAUNCH_CONFIG
  value: /run/relaunch/cluster.json
{{- end }}
- name: RELAUNCH_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $v.database.existingSecret }}
      key: {{ $v.database.key }}
{{- if and (eq $v.mode "incluster") (not (hasKey . "clusters")) }}
- name: RELAUNCH_MUNGE_SOCKET
  value: /run/munge/munge.socket.2
{{- end }}
{{- if and (eq .component "console") $v.console.sessionSecret.existingSecret }}
- name: RELAUNCH_CONSOLE_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ $v.console.sessionSecret.existingSecret }}
      key: {{ $v.console.sessionSecret.key }}
{{- end }}
- name: HOME
  value: /tmp
{{- if eq .component "worker" }}
- name: RELAUNCH_WORKER_PROCESSES
  value: {{ $v.worker.processes | int | quote }}
{{- end }}
{{- with $v.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The container of one component: (dict "root" $ "component" "worker" "command" "worker"),
with "args" where the command line is not `COMMAND --config /run/relaunch/cluster.json`. */}}
{{- define "relaunch.container" -}}
{{- $v := .root.Values -}}
{{- $c := index $v .component -}}
{{- $args := list .command "--config" "/run/relaunch/cluster.json" -}}
{{- if hasKey . "args" -}}
{{- $args = .args -}}
{{- else if hasKey .root "relaunchCluster" -}}
{{- $args = concat $args (list "--cluster" .root.relaunchCluster) -}}
{{- end -}}
- name: {{ .component }}
  image: {{ include "relaunch.image" .root }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  command: ["relaunch-entrypoint"]
  args: [{{ range $i, $arg := $args }}{{ if $i }}, {{ end }}{{ $arg | quote }}{{ end }}]
  env:
    {{- include "relaunch.env" . | nindent 4 }}
  {{- with $v.extraEnvFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if eq .component "console" }}
  ports:
    - name: http
      containerPort: {{ $v.console.port }}
      protocol: TCP
  # Alive while it serves (/livez): an outage of PostgreSQL or Temporal makes /healthz 503,
  # which takes the console out of its Service (readiness) without restarting it.
  startupProbe:
    httpGet: {path: /livez, port: http}
    periodSeconds: 2
    failureThreshold: 30
  livenessProbe:
    httpGet: {path: /livez, port: http}
    periodSeconds: 15
    timeoutSeconds: 5
  readinessProbe:
    httpGet: {path: /healthz, port: http}
    periodSeconds: 10
    timeoutSeconds: 5
  {{- else }}
  {{- if $v.monitoring.enabled }}
  ports:
    {{- include "relaunch.metricsPorts" . | trim | nindent 4 }}
  {{- end }}
  # No HTTP endpoint: the probe checks what can go bad under a running process (the written
  # configuration, the key, known_hosts, certificate and token files it names, the munge socket).
  livenessProbe:
    exec:
      command: ["relaunch-entrypoint", "--check"]
    {{- toYaml $c.livenessProbe | nindent 4 }}
  readinessProbe:
    exec:
      command: ["relaunch-entrypoint", "--check"]
    {{- toYaml $c.readinessProbe | nindent 4 }}
  {{- end }}
  resources:
    {{- toYaml $c.resources | nindent 4 }}
  securityContext:
    {{- toYaml $v.securityContext | nindent 4 }}
  volumeMounts:
    {{- include "relaunch.volumeMounts" . | nindent 4 }}
{{- end -}}


{{/* Monitoring. The port a worker or watcher serves /metrics (and /healthz) on, written into
the configuration's `metrics` section: (dict "root" ctx "component" "worker"). */}}
{{- define "relaunch.metricsPort" -}}
{{- index .root.Values.monitoring.ports .component | int -}}
{{- end -}}

{{/* Its ports, named for the ServiceMonitor: `metrics`, and with worker.processes N > 1 the
worker's process i (2..N) on port + i - 1 as `metrics-<i>`; as a container's (with "service":
a Service's) ports list. */}}
{{- define "relaunch.metricsPorts" -}}
{{- $port := include "relaunch.metricsPort" . | int -}}
{{- $count := 1 -}}
{{- if eq .component "worker" -}}
{{- $count = .root.Values.worker.processes | int -}}
{{- end -}}
{{- range $i := until $count }}
{{- $name := ternary "metrics" (printf "metrics-%d" (add $i 1)) (eq $i 0) }}
- name: {{ $name }}
  {{- if hasKey $ "service" }}
  port: {{ add $port $i }}
  targetPort: {{ $name }}
  {{- else }}
  containerPort: {{ add $port $i }}
  {{- end }}
  protocol: TCP
{{- end }}
{{- end -}}

{{/* The release's cluster names, as a PromQL regular expression (cluster=~`...`). */}}
{{- define "relaunch.clusterRegex" -}}
{{- $clusters := dict -}}
{{- include "relaunch.clusterContexts" (dict "root" . "out" $clusters) -}}
{{- $names := list -}}
{{- range $clusters.items -}}
{{- $names = append $names (regexQuoteMeta .Values.cluster.name) -}}
{{- end -}}
{{- join "|" $names -}}
{{- end -}}

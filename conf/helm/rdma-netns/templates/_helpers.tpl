{{/* The DaemonSet's name: the release name when it already says rdma-netns. */}}
{{- define "rdma-netns.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The DRA driver's DaemonSet, ServiceAccount and roles: the DaemonSet's name and -dra. */}}
{{- define "rdma-netns.draFullname" -}}
{{- printf "%s-dra" (include "rdma-netns.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The DRA driver's pods' app.kubernetes.io/name: apart from the main DaemonSet's, whose selector must not count them. */}}
{{- define "rdma-netns.draName" -}}
{{- printf "%s-dra" (include "rdma-netns.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rdma-netns.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The one image every container runs: by digest when one is given. */}}
{{- define "rdma-netns.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (toString .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Where a host directory is mounted in the installer: under /host. */}}
{{- define "rdma-netns.hostMount" -}}
{{- printf "/host%s" (trimSuffix "/" .) -}}
{{- end -}}

{{/*
The NRI plugin's policy flags, as a JSON list: the same for the DaemonSet's
nri container and the copy installed into the runtime, so a pod gets the
same limits whichever instance serves it.
*/}}
{{- define "rdma-netns.nriFlags" -}}
{{- $n := .Values.nri -}}
{{- $flags := list "--memlock" (toString $n.memlock) "--shm-size" (toString $n.shmSize) -}}
{{- with $n.maxShmSize -}}
{{- $flags = concat $flags (list "--max-shm-size" (toString .)) -}}
{{- end -}}
{{- concat $flags (list "--sandbox-root" $n.sandboxRoot "--log-level" $n.logLevel) | toJson -}}
{{- end -}}

{{/* The DaemonSet's nodeSelector: rdmaNodeLabel (KEY=VALUE) and nodeSelector, whose value wins for the same key. */}}
{{- define "rdma-netns.nodeSelector" -}}
{{- $sel := deepCopy (.Values.nodeSelector | default dict) -}}
{{- with .Values.rdmaNodeLabel -}}
{{- $kv := splitn "=" 2 . -}}
{{- if not (hasKey $sel $kv._0) -}}
{{- $_ := set $sel $kv._0 $kv._1 -}}
{{- end -}}
{{- end -}}
{{- toJson $sel -}}
{{- end -}}

{{/* The init container's command: install the plugin, and the NRI plugin with its flags. */}}
{{- define "rdma-netns.installCommand" -}}
{{- $cmd := list "/rdma-netns" "install" "--dest" (include "rdma-netns.hostMount" .Values.cniBinDir) -}}
{{- if include "rdma-netns.claimsEntry" . -}}
{{- $cmd = concat $cmd (list "--claims-entry" "--cni-conf-dir" (include "rdma-netns.hostMount" .Values.cniConfDir)) -}}
{{- end -}}
{{- if and .Values.nri.enabled .Values.nri.preinstalled -}}
{{- $cmd = concat $cmd (list "--nri" "/rdma-netns-nri" "--nri-plugin-dir" (include "rdma-netns.hostMount" .Values.nri.pluginDir) "--nri-conf-dir" (include "rdma-netns.hostMount" .Values.nri.confDir) "--nri-index" (toString .Values.nri.index) "--") (include "rdma-netns.nriFlags" . | fromJsonArray) -}}
{{- end -}}
{{- toJson $cmd -}}
{{- end -}}

{{/* "true" when /metrics needs a reviewed token (exporter.auth.enabled true; null is an image older than --auth). */}}
{{- define "rdma-netns.exporterAuth" -}}
{{- if and (kindIs "bool" .Values.exporter.auth.enabled) .Values.exporter.auth.enabled -}}true{{- end -}}
{{- end -}}

{{/* "true" when the exporter serves HTTPS: with authentication (a self-signed certificate unless auth.tlsSecret), or with a certificate given. */}}
{{- define "rdma-netns.exporterTLS" -}}
{{- if or (include "rdma-netns.exporterAuth" .) .Values.exporter.auth.tlsSecret -}}true{{- end -}}
{{- end -}}

{{/* Where the exporter container finds the certificate of auth.tlsSecret. */}}
{{- define "rdma-netns.exporterTLSDir" -}}/etc/rdma-netns-exporter/tls{{- end -}}

{{/* The exporter's command, as a JSON list. */}}
{{- define "rdma-netns.exporterCommand" -}}
{{- $e := .Values.exporter -}}
{{- $cmd := list "/rdma-netns-exporter" "--listen" (printf ":%v" $e.port) "--state-dir" .Values.stateDir -}}
{{- if not (kindIs "invalid" $e.cacheMaxAge) -}}
{{- $cmd = concat $cmd (list "--cache-max-age" (toString $e.cacheMaxAge)) -}}
{{- end -}}
{{- if include "rdma-netns.exporterAuth" . -}}
{{- $cmd = concat $cmd (list "--auth" "kubernetes" "--auth-cache-ttl" (toString $e.auth.cacheTTL)) -}}
{{- else if kindIs "bool" $e.auth.enabled -}}
{{- $cmd = concat $cmd (list "--auth" "none") -}}
{{- end -}}
{{- with $e.auth.tlsSecret -}}
{{- $dir := include "rdma-netns.exporterTLSDir" $ -}}
{{- $cmd = concat $cmd (list "--tls-cert-file" (printf "%s/tls.crt" $dir) "--tls-private-key-file" (printf "%s/tls.key" $dir)) -}}
{{- end -}}
{{- toJson $cmd -}}
{{- end -}}

{{/* The DRA driver's name: its kubelet plugin directory, its ResourceSlices and the DeviceClass's selector (pkg/drarecord.DriverName). */}}
{{- define "rdma-netns.draDriver" -}}nic.rdma-netns.io{{- end -}}

{{/* Where the DRA driver writes its records and rdma-netns reads them (pkg/drarecord.DefaultDir; rdma-netns reads them nowhere else, whatever a NAD says). */}}
{{- define "rdma-netns.draRecordDir" -}}/var/lib/cni/rdma-netns-dra{{- end -}}

{{/* A projected volume holding what automountServiceAccountToken would mount: a token the kubelet renews, the cluster's CA, the namespace. */}}
{{- define "rdma-netns.tokenVolume" -}}
projected:
  sources:
    - serviceAccountToken:
        path: token
        expirationSeconds: 3607
    - configMap:
        name: kube-root-ca.crt
        items:
          - key: ca.crt
            path: ca.crt
    - downwardAPI:
        items:
          - path: namespace
            fieldRef:
              fieldPath: metadata.namespace
{{- end -}}

{{/* "true" when the installer keeps the claims entry in the node's primary network. */}}
{{- define "rdma-netns.claimsEntry" -}}
{{- if and .Values.dra.enabled .Values.dra.claimsEntry -}}true{{- end -}}
{{- end -}}

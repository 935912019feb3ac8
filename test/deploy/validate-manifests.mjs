// Validates Kubernetes manifests against the Kubernetes (and Prometheus Operator) OpenAPI schemas
// with kubernetes-models, offline. ESM because those packages are ESM-only.
// Input: a JSON array of manifest objects on stdin. Output: a JSON array of
// { kind, name, ok, error? } on stdout. A kind it has no schema for is an error, never a pass.
import { readFileSync } from 'node:fs';

const groups = {
  v1: () => import('kubernetes-models/v1'),
  'apps/v1': () => import('kubernetes-models/apps/v1'),
  'policy/v1': () => import('kubernetes-models/policy/v1'),
  'monitoring.coreos.com/v1': () => import('@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1'),
};

const docs = JSON.parse(readFileSync(0, 'utf8'));
const results = [];
for (const doc of docs) {
  const kind = doc?.kind;
  const name = doc?.metadata?.name;
  const load = groups[doc?.apiVersion];
  const mod = load ? await load() : null;
  const Model = mod?.[kind];
  if (!Model) {
    results.push({ kind, name, ok: false, error: `no schema for ${doc?.apiVersion} ${kind}` });
    continue;
  }
  try {
    new Model(doc).validate();
    results.push({ kind, name, ok: true });
  } catch (err) {
    results.push({ kind, name, ok: false, error: String(err?.message ?? err) });
  }
}
process.stdout.write(JSON.stringify(results));

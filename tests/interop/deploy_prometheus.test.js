'use strict';
// deploy/kubernetes/prometheusrule.yaml (for the Prometheus Operator) holds exactly the
// rule groups of deploy/prometheus/kvroute-rules.yaml, and what the operator would hand
// Prometheus passes `promtool check rules` too. The rules' own tests are promtool's
// (deploy/prometheus/kvroute-rules.test.yaml, the ctest deploy_prometheus_rules_test).

const { test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const YAML = require('yaml');

const kDeploy = path.join(__dirname, '..', '..', 'deploy');
const kRuleFile = path.join(kDeploy, 'prometheus', 'kvroute-rules.yaml');
const kManifest = path.join(kDeploy, 'kubernetes', 'prometheusrule.yaml');

const rules = YAML.parse(fs.readFileSync(kRuleFile, 'utf8'));
const docs = YAML.parseAllDocuments(fs.readFileSync(kManifest, 'utf8')).map((d) => d.toJS());

test('the PrometheusRule manifest has the rule file\'s groups, unchanged', () => {
  assert.equal(docs.length, 1);
  const m = docs[0];
  assert.equal(m.apiVersion, 'monitoring.coreos.com/v1');
  assert.equal(m.kind, 'PrometheusRule');
  assert.equal(m.metadata.name, 'kvroute');
  assert.ok(m.metadata.namespace, 'no namespace');
  assert.deepEqual(Object.keys(m.spec), ['groups']);
  assert.deepEqual(Object.keys(rules), ['groups']);
  assert.deepEqual(m.spec.groups, rules.groups);
});

test('every alert has a severity, a summary and a description', () => {
  const alerts = rules.groups.flatMap((g) => g.rules);
  assert.ok(alerts.length >= 10);
  for (const a of alerts) {
    assert.ok(a.alert, `a rule without alert: ${JSON.stringify(a)}`);
    assert.ok(['warning', 'critical'].includes(a.labels.severity), `${a.alert}: severity ${a.labels.severity}`);
    assert.ok(a.annotations.summary && a.annotations.description, `${a.alert}: annotations`);
  }
  // Every alert has a unit test (promtool fails only on tests that exist).
  const tests = YAML.parse(fs.readFileSync(path.join(kDeploy, 'prometheus', 'kvroute-rules.test.yaml'), 'utf8'));
  const tested = new Set(tests.tests.flatMap((t) => t.alert_rule_test.map((a) => a.alertname)));
  const firing = new Set(tests.tests.flatMap((t) => t.alert_rule_test)
    .filter((a) => a.exp_alerts.length > 0).map((a) => a.alertname));
  for (const a of alerts) {
    assert.ok(tested.has(a.alert), `${a.alert}: no unit test`);
    assert.ok(firing.has(a.alert), `${a.alert}: no unit test where it fires`);
  }
});

test('the manifest\'s groups pass promtool check rules', (t) => {
  if (spawnSync('promtool', ['--version']).status !== 0) {
    t.skip('no promtool');
    return;
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvroute-rules-'));
  const file = path.join(dir, 'from-manifest.yaml');
  fs.writeFileSync(file, YAML.stringify({ groups: docs[0].spec.groups }));
  const r = spawnSync('promtool', ['check', 'rules', file], { encoding: 'utf8' });
  fs.rmSync(dir, { recursive: true, force: true });
  assert.equal(r.status, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /SUCCESS: \d+ rules found/);
});

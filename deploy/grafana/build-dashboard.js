#!/usr/bin/env node
'use strict';
// Writes kvroute.json, the Grafana dashboard over kvroute serve's and kvroute epp's own
// /metrics, from the panel list below: `node deploy/grafana/build-dashboard.js` after an
// edit here (tests/interop/dashboard.test.js fails while kvroute.json differs from what
// this prints, and queries every panel's expressions against a live fleet).
// Usage: build-dashboard.js [--check]   (--check: exit 1 if kvroute.json is out of date)

const fs = require('node:fs');
const path = require('node:path');

// Every expression selects the routers the job and instance variables name.
const SEL = 'job=~"$job", instance=~"$instance"';
const sel = (extra = '') => `{${SEL}${extra ? `, ${extra}` : ''}}`;
const rate = (metric, extra = '') => `rate(${metric}${sel(extra)}[$__rate_interval])`;
const quantile = (q, metric, by = '', extra = '') =>
  `histogram_quantile(${q}, sum by (le${by ? `, ${by}` : ''}) (${rate(`${metric}_bucket`, extra)}))`;

// One section: a row and its panels. A panel: title, description (says which of serve
// and epp report it), unit, targets [expr, legend], and optionally type and extra options.
const sections = [
  {
    row: 'Traffic',
    panels: [
      { title: 'Requests by status', unit: 'reqps',
        description: 'Requests answered, by HTTP status (serve: every request; epp: the answers it saw on the stream). kvroute_requests_total.',
        targets: [[`sum by (code) (${rate('kvroute_requests_total')})`, '{{code}}']] },
      { title: 'Requests by endpoint', unit: 'reqps',
        description: 'Requests answered, by the endpoint that answered. kvroute_requests_total.',
        targets: [[`sum by (endpoint) (${rate('kvroute_requests_total', 'endpoint!=""')})`, '{{endpoint}}']] },
      { title: 'Endpoints', unit: 'short',
        description: 'Endpoints in the pool; up: scrapes not refused; fresh: metrics within pool.staleness; ejected: kept out by outlier detection. Per router.',
        targets: [
          [`count by (job, instance) (kvroute_endpoint_up${sel()})`, 'total {{instance}}'],
          [`sum by (job, instance) (kvroute_endpoint_up${sel()})`, 'up {{instance}}'],
          [`sum by (job, instance) (kvroute_endpoint_metrics_fresh${sel()})`, 'fresh {{instance}}'],
          [`sum by (job, instance) (kvroute_endpoint_ejected${sel()})`, 'ejected {{instance}}'],
        ] },
      { title: 'Picks', unit: 'ops',
        description: 'epp: picks by status (llm_d_epp_scheduler_attempts_total). Both: picks that found no usable endpoint (answered 503).',
        targets: [
          [`sum by (status) (${rate('llm_d_epp_scheduler_attempts_total')})`, 'epp {{status}}'],
          [`sum by (job, instance) (${rate('kvroute_pick_failures_total')})`, 'no endpoint {{instance}}'],
        ] },
    ],
  },
  {
    row: 'KV cache and queues',
    panels: [
      { title: 'KV-cache usage spread', unit: 'percentunit',
        description: 'Lowest, mean and highest KV-cache usage over the endpoints, as last scraped: the spread of gpu_cache_usage_perc. A wide band with queues (next panels) is lopsided load.',
        targets: [
          [`min(kvroute_endpoint_kv_usage${sel()})`, 'min'],
          [`avg(kvroute_endpoint_kv_usage${sel()})`, 'mean'],
          [`max(kvroute_endpoint_kv_usage${sel()})`, 'max'],
        ],
        band: ['min', 'max'] },
      { title: 'KV-cache usage per endpoint (heatmap)', type: 'heatmap', unit: 'percentunit',
        description: 'How many endpoints sit at each KV-cache usage over time. kvroute_endpoint_kv_usage.',
        targets: [[`max by (endpoint) (kvroute_endpoint_kv_usage${sel()})`, '{{endpoint}}']] },
      { title: 'KV-cache usage per endpoint', unit: 'percentunit',
        description: 'As scraped, and adjusted: plus the router\'s estimate of what it sent since the scrape.',
        targets: [
          [`max by (endpoint) (kvroute_endpoint_kv_usage${sel()})`, '{{endpoint}}'],
          [`max by (endpoint) (kvroute_endpoint_kv_usage_adjusted${sel()})`, '{{endpoint}} adjusted'],
        ] },
      { title: 'Queued requests per endpoint', unit: 'short',
        description: 'vllm:num_requests_waiting as scraped, and adjusted: plus requests dispatched and not yet started.',
        targets: [
          [`max by (endpoint) (kvroute_endpoint_waiting${sel()})`, '{{endpoint}}'],
          [`max by (endpoint) (kvroute_endpoint_waiting_adjusted${sel()})`, '{{endpoint}} adjusted'],
        ] },
      { title: 'Running and in flight per endpoint', unit: 'short',
        description: 'Running requests as scraped, and requests the routers have in flight there.',
        targets: [
          [`max by (endpoint) (kvroute_endpoint_running${sel()})`, '{{endpoint}} running'],
          [`sum by (endpoint) (kvroute_endpoint_inflight${sel()})`, '{{endpoint}} in flight'],
        ] },
      { title: 'Pool averages (epp)', unit: 'short',
        description: 'epp\'s pool gauges over ready endpoints: mean and standard deviation of KV usage (0..1) and of queues; the saturation detector\'s saturated share.',
        targets: [
          [`llm_d_epp_average_kv_cache_utilization${sel()}`, 'KV mean {{name}}'],
          [`llm_d_epp_std_dev_kv_cache_utilization${sel()}`, 'KV std dev {{name}}'],
          [`llm_d_epp_average_queue_size${sel()}`, 'queue mean {{name}}'],
          [`llm_d_epp_flow_control_pool_saturation${sel()}`, 'saturated share {{name}}'],
        ] },
    ],
  },
  {
    row: 'Prefix cache',
    panels: [
      { title: 'Fleet prefix hit rate', unit: 'percentunit',
        description: 'reported (epp): cached prompt tokens / prompt tokens from the answers\' usage (engines with --enable-prompt-tokens-details). estimated (serve, epp): the mean prefix score of the chosen endpoint since start. kvroute doctor calls under 50% on shared-prefix traffic prefix-reuse-lost.',
        targets: [
          [`sum by (job, instance) (${rate('llm_d_epp_request_cached_tokens_sum')}) / sum by (job, instance) (${rate('llm_d_epp_request_input_tokens_sum')})`, 'reported {{instance}}'],
          [`kvroute_prefix_estimated_hit_ratio${sel()}`, 'estimated {{job}} {{instance}}'],
        ],
        thresholds: [0.5] },
      { title: 'Mean score of the chosen endpoint, by scorer', unit: 'percentunit',
        description: 'What each scorer (0..1) said about the endpoint picked, averaged over the interval. kvroute_plugin_score.',
        targets: [[`sum by (plugin) (${rate('kvroute_plugin_score_sum')}) / sum by (plugin) (${rate('kvroute_plugin_score_count')})`, '{{plugin}}']] },
      { title: 'Prefix index entries per endpoint', unit: 'short',
        description: 'Prompt blocks the router\'s prefix model assumes cached on each endpoint.',
        targets: [[`max by (endpoint) (kvroute_prefix_index_entries${sel()})`, '{{endpoint}}']] },
      { title: 'Endpoints by KV-event state', unit: 'short',
        description: 'Endpoints with KV events configured, by state: live (scored by their events), unknown, stale, resync, mismatch (all four scored by the approximate model). kvroute_kv_events_state.',
        targets: [[`sum by (state) (kvroute_kv_events_state${sel()})`, '{{state}}']] },
      { title: 'KV events applied', unit: 'ops',
        description: 'Events applied to the precise index by type, and the sequence gaps (replayed or not) and undecodable batches.',
        targets: [
          [`sum by (type) (${rate('kvroute_kv_events_events_total')})`, '{{type}}'],
          [`sum(${rate('kvroute_kv_events_gaps_total')})`, 'gaps'],
          [`sum(${rate('kvroute_kv_events_gaps_unrepaired_total')})`, 'gaps unrepaired'],
          [`sum(${rate('kvroute_kv_events_decode_errors_total')})`, 'decode errors'],
        ] },
      { title: 'KV events: last batch age and lag', unit: 's',
        description: 'Seconds since each endpoint\'s last batch was applied, and the receive lag of its last live batch (wall clocks).',
        targets: [
          [`max by (endpoint) (kvroute_kv_events_last_batch_age_seconds${sel()})`, '{{endpoint}} age'],
          [`max by (endpoint) (kvroute_kv_events_lag_seconds${sel()})`, '{{endpoint}} lag'],
        ] },
      { title: 'Route receipts', unit: 'ops',
        description: 'Answers whose engine reported its cached prompt tokens for a pick predicted from KV events; mispredicted: off by more than a block; unreported: no count in the answer.',
        targets: [
          [`sum(${rate('kvroute_route_receipts_total')})`, 'receipts'],
          [`sum(${rate('kvroute_route_receipts_mispredicted_total')})`, 'mispredicted'],
          [`sum(${rate('kvroute_route_receipts_unreported_total')})`, 'unreported'],
        ] },
      { title: 'Route receipt accuracy', unit: 'short',
        description: 'Cached tokens the engines reported / predicted (1: exact), and the p90 of |reported - predicted| tokens per receipt.',
        targets: [
          [`sum(${rate('kvroute_route_receipts_reported_tokens_total')}) / sum(${rate('kvroute_route_receipts_predicted_tokens_total')})`, 'reported / predicted'],
          [quantile(0.9, 'kvroute_route_receipt_error_tokens'), 'p90 error tokens'],
        ] },
    ],
  },
  {
    row: 'Latency',
    panels: [
      { title: 'TTFT (epp)', unit: 's',
        description: 'Time from the pick to the first response byte, as epp saw it on the stream. llm_d_epp_request_ttft_seconds.',
        targets: [0.5, 0.9, 0.99].map((q) => [quantile(q, 'llm_d_epp_request_ttft_seconds'), `p${q * 100}`]) },
      { title: 'TPOT (epp)', unit: 's',
        description: 'Time per output token after the first byte (answers of two tokens or more). llm_d_epp_request_ntpot_seconds.',
        targets: [0.5, 0.9, 0.99].map((q) => [quantile(q, 'llm_d_epp_request_ntpot_seconds'), `p${q * 100}`]) },
      { title: 'Predicted TTFT and TPOT', unit: 's',
        description: 'What the latency model predicted at dispatch (serve and epp, once it has samples). llm_d_epp_request_predicted_*_seconds.',
        targets: [
          [quantile(0.5, 'llm_d_epp_request_predicted_ttft_seconds'), 'TTFT p50'],
          [quantile(0.9, 'llm_d_epp_request_predicted_ttft_seconds'), 'TTFT p90'],
          [quantile(0.5, 'llm_d_epp_request_predicted_tpot_seconds'), 'TPOT p50'],
          [quantile(0.9, 'llm_d_epp_request_predicted_tpot_seconds'), 'TPOT p90'],
        ] },
      { title: 'Objectives missed', unit: 'percentunit',
        description: 'Share of the requests with a TTFT or TPOT objective that missed it (kvroute_slo_*). kvroute doctor\'s slo-missed: over 10%.',
        targets: [[`sum by (type) (${rate('kvroute_slo_violations_total')}) / sum by (type) (${rate('kvroute_slo_requests_total')})`, '{{type}}']],
        thresholds: [0.1] },
      { title: 'Latency model error', unit: 'percentunit',
        description: 'Mean |predicted - observed| / observed of the latency model\'s TTFT and TPOT predictions (kvroute doctor\'s latency-model-inaccurate: over 50%).',
        targets: [[`sum by (kind) (${rate('kvroute_latency_prediction_abs_relative_error_total')}) / sum by (kind) (${rate('kvroute_latency_predictions_scored_total')})`, '{{kind}}']] },
      { title: 'Request duration (epp)', unit: 's',
        description: 'From the request headers to the end of the response. llm_d_epp_request_duration_seconds.',
        targets: [0.5, 0.9, 0.99].map((q) => [quantile(q, 'llm_d_epp_request_duration_seconds'), `p${q * 100}`]) },
      { title: 'Scheduling time', unit: 's',
        description: 'Time one pick took in the scheduler. kvroute_scheduling_duration_seconds.',
        targets: [0.5, 0.99].map((q) => [quantile(q, 'kvroute_scheduling_duration_seconds', 'job'), `p${q * 100} {{job}}`]) },
    ],
  },
  {
    row: 'Picks by decision',
    panels: [
      { title: 'Picks by locality decision', unit: 'ops',
        description: 'Committed picks by the locality-filter\'s decision (off: no router region). kvroute_locality_picks_total; docs/REGIONS.md.',
        targets: [[`sum by (decision) (${rate('kvroute_locality_picks_total')})`, '{{decision}}']] },
      { title: 'Requests by region', unit: 'reqps',
        description: 'Requests answered by region of the endpoint (empty: no region label, local), and the share of picks spilled to a remote region since start.',
        targets: [
          [`sum by (region) (${rate('kvroute_locality_requests_total')})`, 'region "{{region}}"'],
          [`max by (job, instance) (kvroute_locality_spill_ratio${sel()})`, 'spill ratio {{instance}}'],
        ] },
      { title: 'Picks by prefill/decode decision', unit: 'ops',
        description: 'In pools with prefill endpoints: disaggregate, short_prompt, cached, no_prefill. kvroute_pd_decisions_total.',
        targets: [[`sum by (decision) (${rate('kvroute_pd_decisions_total')})`, '{{decision}}']] },
      { title: 'Session picks by outcome', unit: 'ops',
        description: 'Picks of requests with a session id: bound, new, moved_gone, moved_saturated, token; and the sessions bound now.',
        targets: [
          [`sum by (outcome) (${rate('kvroute_session_picks_total')})`, '{{outcome}}'],
          [`sum(kvroute_sessions${sel()})`, 'sessions'],
        ] },
    ],
  },
  {
    row: 'Ejections and retries',
    panels: [
      { title: 'Endpoints down or ejected', unit: 'short',
        description: '1 while an endpoint refuses scrapes (down) or is ejected by outlier detection.',
        targets: [
          [`max by (endpoint) (1 - kvroute_endpoint_up${sel()})`, '{{endpoint}} down'],
          [`max by (endpoint) (kvroute_endpoint_ejected${sel()})`, '{{endpoint}} ejected'],
        ] },
      { title: 'Ejections', unit: 'short',
        description: 'Outlier ejections per endpoint, and those not made because of max_ejection_percent.',
        targets: [
          [`sum by (endpoint) (increase(kvroute_endpoint_ejections_total${sel()}[$__rate_interval]))`, '{{endpoint}}'],
          [`sum(increase(kvroute_ejections_skipped_total${sel()}[$__rate_interval]))`, 'skipped'],
        ] },
      { title: 'Retries', unit: 'ops',
        description: 'Attempts sent to a fallback endpoint; free: after a connect failure (no engine work lost); denied: not retried, the retry budget was spent.',
        targets: [
          [`sum(${rate('kvroute_retries_total')})`, 'retries'],
          [`sum(${rate('kvroute_retries_free_total')})`, 'free'],
          [`sum(${rate('kvroute_retries_denied_total')})`, 'denied'],
        ] },
      { title: 'Upstream errors', unit: 'ops',
        description: 'Failed upstream attempts by endpoint and kind. kvroute_upstream_errors_total.',
        targets: [[`sum by (endpoint, kind) (${rate('kvroute_upstream_errors_total')})`, '{{endpoint}} {{kind}}']] },
      { title: 'Endpoint scrapes', unit: 'short',
        description: 'Seconds since each endpoint\'s last good scrape, failed scrapes per second, and engine restarts seen.',
        targets: [
          [`max by (endpoint) (kvroute_endpoint_scrape_age_seconds${sel()})`, '{{endpoint}} age'],
          [`sum by (endpoint) (${rate('kvroute_endpoint_scrapes_failed_total')})`, '{{endpoint}} failed/s'],
          [`sum by (endpoint) (increase(kvroute_endpoint_restarts_total${sel()}[$__rate_interval]))`, '{{endpoint}} restarts'],
        ] },
    ],
  },
  {
    row: 'Flow control',
    panels: [
      { title: 'Flow queue', unit: 'short',
        description: 'Requests waiting at the router by priority band (flow: {enabled: true}).',
        targets: [[`sum by (priority) (kvroute_flow_waiting_requests${sel()})`, 'priority {{priority}}']] },
      { title: 'Flow queue bytes', unit: 'bytes',
        description: 'Request body bytes waiting by priority band.',
        targets: [[`sum by (priority) (kvroute_flow_waiting_bytes${sel()})`, 'priority {{priority}}']] },
      { title: 'Flow wait p90', unit: 's',
        description: 'Time dispatched requests waited in the flow queue (0 when dispatched at arrival), by priority band.',
        targets: [[quantile(0.9, 'kvroute_flow_wait_seconds', 'priority'), 'priority {{priority}}']] },
      { title: 'Flow dispatches by cause', unit: 'ops',
        description: 'immediate (at arrival), order, affinity (prefix affinity) or aged (past the affinity skips).',
        targets: [[`sum by (cause) (${rate('kvroute_flow_dispatched_total')})`, '{{cause}}']] },
      { title: 'Requests shed', unit: 'ops',
        description: 'Refused at arrival (429, by reason), expired while waiting (429 past ttl, 503 past no_endpoint_ttl), cancelled by the client.',
        targets: [
          [`sum by (reason) (${rate('kvroute_flow_rejected_total')})`, 'rejected {{reason}}'],
          [`sum by (reason) (${rate('kvroute_flow_expired_total')})`, 'expired {{reason}}'],
          [`sum(${rate('kvroute_flow_cancelled_total')})`, 'cancelled'],
        ] },
      { title: 'Late requests', unit: 'ops',
        description: 'Waiting requests moved behind on-time ones (predicted to miss their TTFT objective), and of those the ones dispatched anyway.',
        targets: [
          [`sum by (priority) (${rate('kvroute_flow_late_total')})`, 'late {{priority}}'],
          [`sum by (priority) (${rate('kvroute_flow_late_dispatched_total')})`, 'dispatched late {{priority}}'],
        ] },
    ],
  },
  {
    row: 'Front door',
    panels: [
      { title: 'Client connections (serve)', unit: 'short',
        description: 'Open client connections; accepted and refused per second.',
        targets: [
          [`sum by (instance) (kvroute_http_open_connections${sel()})`, 'open {{instance}}'],
          [`sum by (instance) (${rate('kvroute_http_connections_accepted_total')})`, 'accepted/s {{instance}}'],
          [`sum by (instance) (${rate('kvroute_http_connections_rejected_total')})`, 'refused/s {{instance}}'],
        ] },
      { title: 'API keys (serve)', unit: 'reqps',
        description: 'Requests under /v1 accepted by key name, and refused with 401 by reason (auth.api_keys_file).',
        targets: [
          [`sum by (key) (${rate('kvroute_auth_requests_total')})`, 'key {{key}}'],
          [`sum by (reason) (${rate('kvroute_auth_rejected_total')})`, 'refused {{reason}}'],
        ] },
      { title: 'Certificate expiry', unit: 'd', type: 'stat',
        description: 'Days until the serving certificate expires (serve\'s listen_tls, epp\'s TLS ext_proc). The KvrouteCertificateExpiringSoon alert fires under 14.',
        targets: [[`(kvroute_tls_cert_expiry_timestamp_seconds${sel()} - time()) / 86400`, '{{job}} {{instance}}']],
        thresholds: [14] },
      { title: 'ext_proc streams (epp)', unit: 'short',
        description: 'Streams open now; started, timed out and cancelled per second.',
        targets: [
          [`sum by (instance) (kvroute_epp_streams_open${sel()})`, 'open {{instance}}'],
          [`sum by (instance) (${rate('kvroute_epp_streams_total')})`, 'started/s {{instance}}'],
          [`sum by (instance) (${rate('kvroute_epp_stream_timeouts_total')})`, 'timed out/s {{instance}}'],
          [`sum by (instance) (${rate('kvroute_epp_streams_cancelled_total')})`, 'cancelled/s {{instance}}'],
        ] },
      { title: 'Configuration reloads', unit: 'short',
        description: 'Configuration reloads applied and rejected (the old configuration stayed).',
        targets: [
          [`sum by (job, instance) (increase(kvroute_config_reloads_total${sel()}[$__rate_interval]))`, 'applied {{instance}}'],
          [`sum by (job, instance) (increase(kvroute_config_reload_failures_total${sel()}[$__rate_interval]))`, 'rejected {{instance}}'],
        ] },
    ],
  },
];

const DS = { type: 'prometheus', uid: '${datasource}' };

function panelJson(p, id, gridPos) {
  const type = p.type || 'timeseries';
  const targets = p.targets.map(([expr, legendFormat], i) => ({
    datasource: DS, expr, legendFormat, range: true, refId: String.fromCharCode(65 + i),
  }));
  const steps = [{ color: 'green', value: null }, ...(p.thresholds || []).map((v) => ({ color: 'red', value: v }))];
  const out = {
    id, type, title: p.title, description: p.description, datasource: DS, gridPos,
    fieldConfig: { defaults: { unit: p.unit, thresholds: { mode: 'absolute', steps } }, overrides: [] },
    options: {},
    targets,
  };
  if (type === 'timeseries') {
    out.fieldConfig.defaults.custom = { drawStyle: 'line', lineWidth: 1, fillOpacity: 0, showPoints: 'never',
      spanNulls: false, thresholdsStyle: { mode: p.thresholds ? 'dashed' : 'off' } };
    out.options = { legend: { displayMode: 'list', placement: 'bottom', showLegend: true },
      tooltip: { mode: 'multi', sort: 'desc' } };
    if (p.band) {
      // The area between the lowest and the highest series is filled: the spread.
      const [low, high] = p.band;
      out.fieldConfig.overrides.push({ matcher: { id: 'byName', options: high },
        properties: [{ id: 'custom.fillBelowTo', value: low }, { id: 'custom.fillOpacity', value: 25 }] });
    }
  } else if (type === 'heatmap') {
    out.options = {
      calculate: true,
      calculation: { yBuckets: { mode: 'size', value: '0.1', scale: { type: 'linear' } } },
      cellGap: 1,
      color: { mode: 'scheme', scheme: 'Oranges', steps: 64, exponent: 0.5, fill: 'dark-orange', reverse: false },
      yAxis: { axisPlacement: 'left', unit: p.unit, min: 0, max: 1 },
      tooltip: { show: true, yHistogram: true },
      legend: { show: true },
      rowsFrame: { layout: 'auto' },
    };
  } else if (type === 'stat') {
    out.options = { reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
      colorMode: 'value', graphMode: 'none', textMode: 'auto', orientation: 'auto', justifyMode: 'auto' };
  }
  return out;
}

function dashboard() {
  const panels = [];
  let id = 1;
  let y = 0;
  for (const s of sections) {
    panels.push({ id: id++, type: 'row', title: s.row, collapsed: false, gridPos: { h: 1, w: 24, x: 0, y }, panels: [] });
    y += 1;
    s.panels.forEach((p, i) => {
      panels.push(panelJson(p, id++, { h: 8, w: 12, x: (i % 2) * 12, y: y + Math.floor(i / 2) * 8 }));
    });
    y += Math.ceil(s.panels.length / 2) * 8;
  }
  const queryVar = (name, label, query) => ({
    name, label, type: 'query', datasource: DS,
    definition: query, query: { query, refId: `${name}-query` },
    refresh: 2, includeAll: true, multi: true, allValue: '.+', sort: 1,
    current: { selected: true, text: ['All'], value: ['$__all'] }, options: [], hide: 0,
  });
  return {
    annotations: { list: [{ builtIn: 1, datasource: { type: 'grafana', uid: '-- Grafana --' }, enable: true,
      hide: true, iconColor: 'rgba(0, 211, 255, 1)', name: 'Annotations & Alerts', type: 'dashboard' }] },
    description: 'kvroute serve and kvroute epp: endpoints\' KV cache and queues, prefix reuse, latency, picks, failures, flow control (deploy/grafana/README.md).',
    editable: true,
    fiscalYearStartMonth: 0,
    graphTooltip: 1,
    id: null,
    links: [],
    panels,
    refresh: '30s',
    schemaVersion: 39,
    tags: ['kvroute', 'llm', 'inference'],
    templating: {
      list: [
        { name: 'datasource', label: 'Data source', type: 'datasource', query: 'prometheus', refresh: 1,
          current: {}, hide: 0, includeAll: false, multi: false, options: [], regex: '' },
        queryVar('job', 'Job', 'label_values(kvroute_endpoint_up, job)'),
        queryVar('instance', 'Instance', 'label_values(kvroute_endpoint_up{job=~"$job"}, instance)'),
      ],
    },
    time: { from: 'now-1h', to: 'now' },
    timepicker: {},
    timezone: '',
    title: 'kvroute',
    uid: 'kvroute',
    version: 1,
    weekStart: '',
  };
}

const text = `${JSON.stringify(dashboard(), null, 2)}\n`;
const file = path.join(__dirname, 'kvroute.json');
if (require.main === module) {
  if (process.argv.includes('--check')) {
    const have = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '';
    if (have !== text) {
      console.error(`${file} is out of date: run node ${path.relative(process.cwd(), __filename)}`);
      process.exit(1);
    }
  } else {
    fs.writeFileSync(file, text);
  }
}
module.exports = { text, file };

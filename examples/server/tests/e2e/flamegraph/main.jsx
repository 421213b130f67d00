// Draws frostdb's `GET /pyroscope/render` answer with Pyroscope's own flame graph component
// (@pyroscope/flamegraph), for examples/tests/e2e/pyroscope_flamegraph.py.
//
// Input: `window.FROSTDB_RENDER`, the render API's JSON as the server sent it.
// Output: `document.body.dataset.state` becomes "ready" once the table and the canvas have
// been drawn, or "error" with the message in `window.FROSTDB_ERROR`.
import React from 'react';
import { createRoot } from 'react-dom/client';
import { FlamegraphRenderer } from '@pyroscope/flamegraph';
import '@pyroscope/flamegraph/dist/index.css';

function fail(message) {
  if (document.body.dataset.state === 'error') return;
  window.FROSTDB_ERROR = String(message);
  document.body.dataset.state = 'error';
}

window.addEventListener('error', (e) => fail(e.error ? e.error.stack || e.error : e.message));
window.addEventListener('unhandledrejection', (e) => fail(e.reason && (e.reason.stack || e.reason)));

// The render answer, as the component's `Profile` ({version, flamebearer, metadata} and the
// optional timeline/groups/leftTicks/rightTicks, which `normalize` spreads into its
// flamebearer). Nothing is filled in: what the server left out, the component must cope
// with, and the test would see it fail.
function toProfile(render) {
  if (!render || typeof render !== 'object') throw new Error('FROSTDB_RENDER is not an object');
  const { flamebearer, metadata } = render;
  if (!flamebearer || !Array.isArray(flamebearer.names) || !Array.isArray(flamebearer.levels)) {
    throw new Error('render answer has no flamebearer.names/levels');
  }
  if (typeof flamebearer.numTicks !== 'number') throw new Error('flamebearer.numTicks missing');
  if (!metadata || (metadata.format !== 'single' && metadata.format !== 'double')) {
    throw new Error(`metadata.format is ${JSON.stringify(metadata && metadata.format)}`);
  }
  return { ...render };
}

class Boundary extends React.Component {
  constructor(props) {
    super(props);
    this.state = { error: null };
  }

  static getDerivedStateFromError(error) {
    return { error };
  }

  componentDidCatch(error) {
    fail(error && (error.stack || error));
  }

  render() {
    return this.state.error ? <pre>{String(this.state.error)}</pre> : this.props.children;
  }
}

// Ready once the canvas says it has drawn and the table has rows (the component sets the
// canvas's data-state in its own effect), checked on animation frames for up to 20 s.
function Ready({ children }) {
  React.useEffect(() => {
    const started = performance.now();
    const check = () => {
      if (document.body.dataset.state === 'error') return;
      const canvas = document.querySelector('canvas.flamegraph-canvas[data-state=rendered]');
      const rows = document.querySelectorAll('[data-testid=table-view] tbody tr');
      if (canvas && canvas.height > 0 && rows.length > 0) {
        document.body.dataset.state = 'ready';
      } else if (performance.now() - started > 20000) {
        fail(`not drawn after 20 s: canvas=${!!canvas} rows=${rows.length}`);
      } else {
        requestAnimationFrame(check);
      }
    };
    requestAnimationFrame(check);
  }, []);
  return children;
}

function main() {
  document.body.dataset.state = 'loading';
  const profile = toProfile(window.FROSTDB_RENDER);
  const root = createRoot(document.getElementById('root'));
  root.render(
    <Boundary>
      <Ready>
        <FlamegraphRenderer profile={profile} showToolbar colorMode="light" />
      </Ready>
    </Boundary>,
  );
}

try {
  main();
} catch (e) {
  fail(e && (e.stack || e));
}

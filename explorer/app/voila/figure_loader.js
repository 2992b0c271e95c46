// The `_esm` of a FigureWidget in a kernel of `explorer app` (serve.figure_widget_class puts the
// server's path to plotly's widget bundle in place of the placeholder below).
//
// Why not just `export default (await import(url)).default`: anywidget 0.11 gives a model 2 s to
// load its module and run initialize(); after that it drops every later message of that model
// for good (its _handle_comm_msg awaits a promise that has rejected). Plotly's bundle is 5 MB:
// on a busy classroom server or a slow network it takes longer, and the charts then never change.
// So this module is ready at once: it starts loading the bundle, records the model's changes
// until plotly is there, then hands plotly a view of the model that replays them in order.
// PLOTLY_MODULE: a promise of plotly's widget module. Under `explorer app`, an import by URL;
// in any other kernel (JupyterLab, Notebook), the promise the kernel's one PlotlyBundle widget
// resolves with the bundle it sent once (assets.BUNDLE_PROMISE_JS).
const url = BUNDLE_SOURCE;
const plotly = PLOTLY_MODULE.then((mod) => mod.default);
const TRAITS = ["_widget_data", "_widget_layout", "_py2js_addTraces", "_py2js_deleteTraces",
  "_py2js_moveTraces", "_py2js_restyle", "_py2js_relayout", "_py2js_update", "_py2js_animate",
  "_py2js_removeLayoutProps", "_py2js_removeTraceProps"];

function deferred(model) {
  const early = [];  // [trait, value] in the order they came
  const hooks = TRAITS.map((t) => ["change:" + t, () => early.push([t, model.get(t)])]);
  for (const [event, hook] of hooks) model.on(event, hook);
  const replaying = new Map();
  const listeners = [];
  const view = {  // the model as plotly sees it
    get: (t) => (replaying.has(t) ? replaying.get(t) : model.get(t)),
    set: (...a) => model.set(...a),
    save_changes: () => model.save_changes(),
    send: (...a) => model.send(...a),
    off: (...a) => model.off(...a),
    on: (event, cb) => { listeners.push([event, cb]); model.on(event, cb); },
    get widget_manager() { return model.widget_manager; },
  };
  const replay = () => {
    for (const [event, hook] of hooks) model.off(event, hook);
    for (const [t, value] of early) {
      replaying.set(t, value);
      for (const [event, cb] of listeners) if (event === "change:" + t) cb();
      replaying.delete(t);
    }
    early.length = 0;
  };
  return { view, replay };
}

export default () => {
  let ready;
  return {
    initialize(ctx) {
      const { view, replay } = deferred(ctx.model);
      ready = plotly.then((factory) => {
        const widget = typeof factory === "function" ? factory() : factory;
        widget.initialize?.({ ...ctx, model: view });
        replay();
        return widget;
      });
      ready.catch(() => {});  // reported by render
    },
    async render(ctx) {
      try {
        const widget = await ready;
        return widget.render?.(ctx);
      } catch (err) {
        ctx.el.textContent = `This chart could not load plotly (${url}): ${err}`;
        return undefined;
      }
    },
  };
};

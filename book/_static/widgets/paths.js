// Loaded between require.js and embed-amd.js on pages with widgets (nb_ipywidgets_js in
// _config.yml). The widget manager takes the URL of its icon fonts from the AMD module id
// "@jupyter-widgets/html-manager/dist/libembed-amd", which require.js resolves against the
// page's own folder (chapters/@jupyter-widgets/html-manager/dist/*.woff2: 404). Map that id
// to this folder, where tools/fetch_assets.sh puts the fonts beside embed-amd.js.
(function () {
  var here = new URL(".", document.currentScript.src).href.replace(/\/$/, "");
  require.config({ paths: { "@jupyter-widgets/html-manager/dist": here } });
})();

// While the page waits for its kernel (every preheated one was taken): what is happening, for how
// long it has been going (counted from the click that opened the page), and how long a fresh start
// took on this server (the pool's last starts, explorer/starts.json). Replaces Voila's
// "Executing 1 of 2". Included by index.html.j2 after Voila's helpers, so its voila_process wins.
(function () {
  let cell = 0;
  let cells = 0;
  let starts = null;
  let asked = false;
  let timer = null;

  function doing() {
    if (cells > 0 && cell >= cells) return "Drawing the dashboard";
    return "Starting a fresh Python kernel for you and loading the model";
  }

  function usually() {
    if (!starts || !starts.length) return "";
    const sorted = [...starts].sort((a, b) => a - b);
    const mid = sorted[Math.floor(sorted.length / 2)];
    const which = sorted.length > 1 ? `the median of its last ${sorted.length}` : "its last one";
    return `, usually about ${Math.round(mid)} s on this server (${which})`;
  }

  function ask() {
    asked = true;
    fetch(window.explorerStartsUrl)
      .then((r) => (r.ok ? r.json() : null))
      .then((j) => {
        starts = j && Array.isArray(j.seconds) ? j.seconds : null;
        show();
      })
      .catch(() => {});
  }

  function show() {
    const box = document.getElementById("loading");
    const el = document.getElementById("loading_text");
    if (!box || !el) {
      if (timer !== null) clearInterval(timer);
      return;
    }
    if (!asked) ask();
    const seconds = Math.floor(performance.now() / 1000); // since the navigation began
    el.classList.add("ie-wait");
    el.style.cssText = "font-size:18px;font-weight:normal;max-width:40em;text-align:center";
    el.textContent =
      `${doing()}: ${seconds} s so far${usually()}. ` +
      "Each visitor gets a kernel of their own; the ready ones are taken, so this one starts now.";
  }

  window.voila_process = function (index, count) {
    cell = index;
    cells = count;
    const box = document.getElementById("loading");
    if (box && box.style.display === "none") box.style.display = "flex";
    show();
  };
  timer = setInterval(show, 1000);
  show();
})();

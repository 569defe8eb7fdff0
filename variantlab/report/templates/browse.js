// Sorts the variant table by a clicked column and filters it by axis values; reads and
// writes text only (textContent), so cell text never becomes markup. Without scripts the
// table is a plain table.
(function () {
  "use strict";
  var table = document.getElementById("browse");
  if (!table || !table.tBodies.length) { return; }
  var head = table.tHead.rows[0];
  var body = table.tBodies[0];
  var rows = Array.prototype.slice.call(body.rows);
  var text = rows.map(function (r) {
    return Array.prototype.map.call(r.cells, function (c) { return c.textContent; });
  });
  var chosen = {};
  var status = document.createElement("p");
  status.className = "note";
  table.parentNode.parentNode.insertBefore(status, table.parentNode);

  function number(t) {
    var s = t.replace(/ \(baseline\)$/, "").replace(/,/g, "").trim();
    if (s === "NaN" || s === "\u2014") { return NaN; }
    return s === "" ? null : Number(s);
  }
  var numeric = Array.prototype.map.call(head.cells, function (th, j) {
    return text.every(function (r) { var x = number(r[j]); return x === null || !isNaN(x) || r[j].trim() === "NaN"; });
  });

  function show() {
    var n = 0;
    rows.forEach(function (r, i) {
      var keep = Object.keys(chosen).every(function (j) { return text[i][j] === chosen[j]; });
      r.hidden = !keep;
      n += keep ? 1 : 0;
    });
    status.textContent = n + " of " + rows.length + " variants shown";
  }

  function sortBy(j, th) {
    var down = th.classList.contains("asc");
    Array.prototype.forEach.call(head.cells, function (c) { c.classList.remove("asc", "desc"); });
    th.classList.add(down ? "desc" : "asc");
    var order = rows.map(function (r, i) { return i; });
    order.sort(function (a, b) {
      var x = text[a][j], y = text[b][j], c;
      if (numeric[j]) {
        x = number(x); y = number(y);
        var bx = x === null || isNaN(x), by = y === null || isNaN(y);
        if (bx || by) { return bx === by ? a - b : (bx ? 1 : -1); }  // blanks last
        c = x - y;
      } else {
        c = x.localeCompare(y, undefined, {numeric: true});
      }
      return (down ? -c : c) || a - b;
    });
    var frag = document.createDocumentFragment();
    order.forEach(function (i) { frag.appendChild(rows[i]); });
    body.appendChild(frag);
  }

  var filters = document.createElement("tr");
  filters.className = "filters";
  Array.prototype.forEach.call(head.cells, function (th, j) {
    th.classList.add("sort");
    th.tabIndex = 0;
    th.title = "sort by this column";
    th.addEventListener("click", function () { sortBy(j, th); });
    th.addEventListener("keydown", function (e) { if (e.key === "Enter") { sortBy(j, th); } });
    var cell = document.createElement("th");
    if (th.getAttribute("data-filter")) {
      var select = document.createElement("select");
      select.setAttribute("aria-label", "filter by " + th.textContent);
      var all = document.createElement("option");
      all.value = "";
      all.text = "(all)";
      select.appendChild(all);
      var values = text.map(function (r) { return r[j]; }).filter(function (v, i, a) { return a.indexOf(v) === i; });
      values.sort(function (x, y) { return x.localeCompare(y, undefined, {numeric: true}); });
      values.forEach(function (v) { var o = document.createElement("option"); o.value = v; o.text = v; select.appendChild(o); });
      select.addEventListener("change", function () {
        if (select.value === "" && select.selectedIndex === 0) { delete chosen[j]; } else { chosen[j] = select.value; }
        show();
      });
      cell.appendChild(select);
    }
    filters.appendChild(cell);
  });
  table.tHead.appendChild(filters);
  Array.prototype.forEach.call(document.querySelectorAll(".js-only"), function (e) { e.hidden = false; });
  show();
}());

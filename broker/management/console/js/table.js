// A sortable, filterable, paged table over a list endpoint. Paging, filtering and sorting go to
// the API (page, page_size, name, use_regex, sort, sort_reverse); endpoints that answer a plain
// array are paged, filtered and sorted here the same way.
import { get, page } from "./api.js";
import { h, clear, num, errorText } from "./util.js";

const STATE = "triomq.table.";

function sortValue(row, key) {
  return key.split(".").reduce((v, k) => (v == null ? undefined : v[k]), row);
}

function localPage(items, { page: p, pageSize, name, regex, sort, reverse }) {
  let filtered = items;
  if (name) {
    let test;
    if (regex) {
      let re;
      try { re = new RegExp(name, "i"); } catch { re = null; }
      test = (s) => (re ? re.test(s) : false);
    } else {
      const needle = name.toLowerCase();
      test = (s) => s.toLowerCase().includes(needle);
    }
    filtered = items.filter((it) => test(String(it.name ?? it.user ?? "")));
  }
  if (sort) {
    filtered = [...filtered].sort((a, b) => {
      const x = sortValue(a, sort), y = sortValue(b, sort);
      const c = typeof x === "number" && typeof y === "number" ? x - y : String(x ?? "").localeCompare(String(y ?? ""));
      return reverse ? -c : c;
    });
  }
  const pageCount = Math.max(1, Math.ceil(filtered.length / pageSize));
  const start = (p - 1) * pageSize;
  return { items: filtered.slice(start, start + pageSize), page: p, page_count: pageCount, page_size: pageSize,
           filtered_count: filtered.length, total_count: items.length, item_count: Math.min(pageSize, filtered.length - start) };
}

export class PagedTable {
  // columns: [{key, label, sort?: api sort key (false: not sortable), render?: row => node, num?: bool}]
  constructor({ id, url, columns, rowLink, empty = "Nothing to show", local = false, title }) {
    this.id = id;
    this.url = url;
    this.columns = columns;
    this.rowLink = rowLink;
    this.local = local;
    const saved = JSON.parse(sessionStorage.getItem(STATE + id) || "{}");
    this.state = { page: 1, pageSize: 100, name: "", regex: false, sort: "", reverse: false, ...saved };
    this.seq = 0;

    this.filter = h("input.filter", { type: "search", placeholder: "Filter by name", value: this.state.name,
      "aria-label": "Filter", on: { input: () => this.debounced() } });
    this.regex = h("input", { type: "checkbox", checked: this.state.regex, on: { change: () => this.update({ regex: this.regex.checked, page: 1 }) } });
    this.pageSize = h("select.page-size", { "aria-label": "Page size", on: { change: () => this.update({ pageSize: Number(this.pageSize.value), page: 1 }) } },
      [20, 50, 100, 500].map((n) => h("option", { value: n, selected: n === this.state.pageSize }, `${n} per page`)));
    this.info = h("span.table-info");
    this.pager = h("span.pager");
    this.head = h("thead");
    this.body = h("tbody");
    this.error = h("div.table-error");
    this.el = h(`section.card.table-card#${id}`, title ? h("h2", title) : null,
      h("div.table-tools", this.filter, h("label.check", this.regex, " Regex"), this.pageSize, h("span.spacer"), this.info, this.pager),
      this.error,
      h("div.table-wrap", h("table.data", this.head, this.body)));
    this.renderHead();
  }

  debounced() {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.update({ name: this.filter.value, page: 1 }), 250);
  }

  update(patch) {
    Object.assign(this.state, patch);
    sessionStorage.setItem(STATE + this.id, JSON.stringify(this.state));
    this.renderHead();
    return this.refresh();
  }

  renderHead() {
    const { sort, reverse } = this.state;
    clear(this.head, h("tr", this.columns.map((c) => {
      const key = c.sort === undefined ? c.key : c.sort;
      if (!key) return h("th", { class: c.num ? "num" : "" }, c.label);
      const active = sort === key;
      return h("th.sortable", {
        class: `sortable${c.num ? " num" : ""}${active ? " sorted" : ""}`,
        "aria-sort": active ? (reverse ? "descending" : "ascending") : "none",
        on: { click: () => this.update({ sort: key, reverse: active ? !reverse : false, page: 1 }) },
      }, c.label, h("span.arrow", active ? (reverse ? " ▼" : " ▲") : ""));
    })));
  }

  async refresh() {
    const seq = ++this.seq;
    let data;
    try {
      if (this.local) {
        // endpoints without paging (users, policies, permissions): the whole list, once
        const all = await get(this.url());
        data = localPage(Array.isArray(all) ? all : all.items, this.state);
      } else {
        data = await page(this.url(), this.state);
        if (data.items.length > data.page_size) data = localPage(data.items, this.state);
      }
    } catch (e) {
      if (seq === this.seq) clear(this.error, errorText(e));
      return;
    }
    if (seq !== this.seq) return; // a newer request answered first
    clear(this.error);
    if (data.page_count && this.state.page > data.page_count) {
      this.update({ page: data.page_count });
      return;
    }
    this.rows = data.items;
    this.renderBody(data);
  }

  renderBody(data) {
    const rows = data.items.map((row) => {
      const tr = h("tr", this.columns.map((c) => {
        const v = c.render ? c.render(row) : sortValue(row, c.key);
        return h("td", { class: c.num ? "num" : "" }, c.num && typeof v === "number" ? num(v) : v);
      }));
      if (this.rowLink) {
        const href = this.rowLink(row);
        tr.classList.add("link-row");
        tr.addEventListener("click", (ev) => { if (!ev.target.closest("button,a,input")) location.hash = href; });
      }
      return tr;
    });
    if (!rows.length) rows.push(h("tr.empty", h("td", { colSpan: this.columns.length }, this.state.name ? "No items match the filter" : "Nothing to show")));
    clear(this.body, rows);
    const shown = data.filtered_count;
    clear(this.info, data.total_count === undefined || shown === data.total_count
      ? `${num(shown)} item${shown === 1 ? "" : "s"}` : `${num(shown)} of ${num(data.total_count)} items`);
    const p = data.page || 1, pc = data.page_count || 1;
    clear(this.pager,
      h("button.btn.btn-small", { type: "button", disabled: p <= 1, "aria-label": "Previous page", on: { click: () => this.update({ page: p - 1 }) } }, "‹"),
      h("span.page-no", ` Page ${p} of ${pc} `),
      h("button.btn.btn-small", { type: "button", disabled: p >= pc, "aria-label": "Next page", on: { click: () => this.update({ page: p + 1 }) } }, "›"));
  }
}

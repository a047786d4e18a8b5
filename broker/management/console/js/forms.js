// Form building blocks: labelled fields, selects, and the typed key/value editor used for
// queue and exchange arguments and policy definitions.
import { h, typedValue } from "./util.js";

let uid = 0;

export function field(label, input, hint) {
  if (!input.id) input.id = `f${++uid}`;
  return h("div.field", h("label", { for: input.id }, label), input, hint ? h("small.hint", hint) : null);
}

export function input(name, attrs = {}) {
  return h("input", { name, type: "text", autocomplete: "off", ...attrs });
}

export function select(name, options, value) {
  return h("select", { name }, options.map((o) => {
    const [v, label] = Array.isArray(o) ? o : [o, o];
    return h("option", { value: v, selected: v === value }, label);
  }));
}

export function textarea(name, attrs = {}) {
  return h("textarea", { name, rows: 4, ...attrs });
}

// A collapsible section with a form; onSubmit(values, form) runs on submit.
export function formCard(title, fields, submitLabel, onSubmit, { open = false, id } = {}) {
  const button = h("button.btn.btn-primary", { type: "submit" }, submitLabel);
  const form = h("form.form", { on: { submit: async (ev) => {
    ev.preventDefault();
    await onSubmit(form, button);
  } } }, fields, h("div.actions", button));
  return h("details.card.form-card", { open, id }, h("summary", title), form);
}

// Shortcuts the definition editor offers, as RabbitMQ's UI does for policies and arguments.
export const QUEUE_ARGUMENTS = [
  ["x-message-ttl", "number"], ["x-expires", "number"], ["x-max-length", "number"],
  ["x-max-length-bytes", "number"], ["x-overflow", "string"], ["x-dead-letter-exchange", "string"],
  ["x-dead-letter-routing-key", "string"], ["x-max-priority", "number"], ["x-queue-mode", "string"],
  ["x-single-active-consumer", "boolean"], ["x-delivery-limit", "number"],
  ["x-dead-letter-strategy", "string"], ["x-quorum-initial-group-size", "number"],
];
export const EXCHANGE_ARGUMENTS = [["alternate-exchange", "string"]];
export const POLICY_KEYS = [
  ["message-ttl", "number"], ["expires", "number"], ["max-length", "number"], ["max-length-bytes", "number"],
  ["overflow", "string"], ["dead-letter-exchange", "string"], ["dead-letter-routing-key", "string"],
  ["delivery-limit", "number"], ["alternate-exchange", "string"], ["queue-master-locator", "string"],
  ["ha-mode", "string"], ["ha-params", "number"], ["ha-sync-mode", "string"],
];

function guessType(key, shortcuts) {
  return shortcuts.find(([k]) => k === key)?.[1] ?? "string";
}

// Rows of key = value (type); always one empty row at the end. value() returns the object.
export function keyValueEditor(name, shortcuts = [], initial = {}) {
  const rows = h("div.kv-rows");
  const editor = h("div.kv-editor", { dataset: { name } }, rows);

  function addRow(key = "", value = "", type = "string") {
    const k = h("input.kv-key", { type: "text", placeholder: "key", value: key, "aria-label": `${name} key` });
    const v = h("input.kv-value", { type: "text", placeholder: "value", "aria-label": `${name} value`,
      value: typeof value === "string" ? value : JSON.stringify(value) });
    const t = select("type", [["string", "String"], ["number", "Number"], ["boolean", "Boolean"], ["list", "List"]], type);
    t.classList.add("kv-type");
    t.setAttribute("aria-label", `${name} type`);
    const row = h("div.kv-row", k, h("span.eq", "="), v, t);
    k.addEventListener("input", () => {
      const known = shortcuts.find(([sk]) => sk === k.value);
      if (known) t.value = known[1];
      if (row === rows.lastElementChild && k.value) addRow();
    });
    rows.append(row);
    return row;
  }

  for (const [k, v] of Object.entries(initial)) {
    const type = typeof v === "number" ? "number" : typeof v === "boolean" ? "boolean" : Array.isArray(v) ? "list" : "string";
    addRow(k, v, type);
  }
  addRow();

  if (shortcuts.length) {
    editor.append(h("div.shortcuts", h("span.muted", "Add: "), shortcuts.map(([key, type]) =>
      h("button.link", { type: "button", on: { click: () => {
        const empty = [...rows.children].find((r) => !r.querySelector(".kv-key").value);
        const row = empty || addRow();
        row.querySelector(".kv-key").value = key;
        row.querySelector(".kv-type").value = type || guessType(key, shortcuts);
        row.querySelector(".kv-value").focus();
        if (row === rows.lastElementChild) addRow();
      } } }, key))));
  }

  editor.value = () => {
    const out = {};
    for (const row of rows.children) {
      const key = row.querySelector(".kv-key").value.trim();
      if (!key) continue;
      const raw = row.querySelector(".kv-value").value;
      try {
        out[key] = typedValue(raw, row.querySelector(".kv-type").value);
      } catch (e) {
        throw new Error(`${name} "${key}": ${e.message}`);
      }
    }
    return out;
  };
  return editor;
}

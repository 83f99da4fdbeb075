// The contract as the pages import it: the one importer of /contract.js (an ES module).

// The facts the pages share with the server (run statuses, alert kinds, the metric-key vocabulary,
// option lists, the column grammar, the float codec) come from /contract.js, which the server
// generates from gradwatch.contract (client_hook/contract/). Pages import them from here.
// (gradwatch report inlines /contract.js and the lib modules, dropping their import statements.)
import { decodeFloat } from "/contract.js";

export {
  AGGREGATIONS,
  ALERT_KINDS,
  BANDS,
  CUSTOM_RULE_OPS,
  CUSTOM_RULE_TYPES,
  ENDED_STATUSES,
  FAMILIES,
  family,
  isLayerKey,
  isLossKey,
  isLrKey,
  isSystemKey,
  KEYS,
  KIND_TITLES,
  parseColumn,
  RULE_SPECS,
  SEVERITIES,
  STATUSES,
  splitColumns,
  TIME_AXES,
  VECTORS,
} from "/contract.js";

// Non-finite numbers travel as strings; turn them back into numbers.
export const num = decodeFloat;

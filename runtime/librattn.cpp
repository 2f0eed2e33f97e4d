// librattn.so is rattn_runtime linked whole; see librattn.map for what it exports.

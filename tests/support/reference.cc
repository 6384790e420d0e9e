// Placeholder; test support code lands here.

-- The operation id of the claim that took a running effect: after a COMMIT
-- whose outcome is unknown (the connection was lost), the claimer finds what
-- its claim took (effect_claimed_by) instead of leaving it to the lease expiry.
ALTER TABLE effects ADD COLUMN claim_op TEXT COLLATE "C";
